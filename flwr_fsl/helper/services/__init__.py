"""Services S1 hosts, one file each: SSA rounds, PSR answers, PSU sums (:mod:`.ssa`, .psr, .psu)."""
