"""The long-running node (``p2psync serve``): configuration, links, metrics (docs/operator.md)."""

from p2psync.node.config import ConfigError, NodeConfig, StaticPeer, TenantConfig, load_config
from p2psync.node.node import Node, NodeError

__all__ = ["ConfigError", "Node", "NodeConfig", "NodeError", "StaticPeer", "TenantConfig", "load_config"]
