"""The curious server's attacks, one module per attack, run against the real strategies and mods."""
