"""p2psync: peer-to-peer replication of Decentralized Web Node (DWN) data."""

__version__ = "0.1.0"
