"""p2psync.blip"""
