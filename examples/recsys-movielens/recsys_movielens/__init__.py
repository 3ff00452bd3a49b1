"""recsys-movielens: a DIN-like CTR model on MovieLens-100k, one comparison of FL protocols."""
