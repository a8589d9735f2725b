"""What each SQL dialect is, independent of the driver that speaks it: capability
flags, compiler settings, the meaning of its error codes, and SQL it needs.
Backends build on these; the core never imports them."""
