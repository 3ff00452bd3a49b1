"""Services S1 hosts, one file each: SSA rounds (:mod:`.ssa`) and PSR answers (:mod:`.psr`)."""
