"""dpf-psr-movielens: a recommender whose clients retrieve and update item rows privately."""
