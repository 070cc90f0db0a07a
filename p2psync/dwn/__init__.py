"""The local DWN engine: the dependency authority.

It decides, exactly as the reference DWN (dwn-sdk-js 0.5.2) does, whether a message is
well-formed, correctly signed, authorized and new, and stores what it accepts in SQLite.
"""
