"""An index-mode app with one private table; the SSA page's mixed-tables diff is applied to it."""
