"""p2psync.peer"""
