"""p2psync.discovery"""
