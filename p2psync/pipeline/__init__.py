"""p2psync.pipeline"""
