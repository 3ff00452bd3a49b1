"""The platform every protocol family builds on.

``errors`` (the error taxonomy), ``wireformat`` (the strict binary reader/writer and the registry
of format tags) and ``traffic`` (byte accounting) sit at the bottom of the stack; ``engine`` (the
round engine of every strategy), ``phases`` (the typed phase contract both ends of a family
import) and ``state`` (typed client state in a Flower ``Context``) are the Flower layer's base.
"""
