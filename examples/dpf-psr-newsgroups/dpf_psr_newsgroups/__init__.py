"""dpf-psr-newsgroups: a text classifier whose clients fetch and update word rows privately."""
