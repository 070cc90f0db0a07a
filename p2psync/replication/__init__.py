"""p2psync.replication"""
