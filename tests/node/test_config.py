"""The node's configuration: the example file parses, precedence (flags > environment > file >
defaults), and every wrong value is one line naming its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2psync.node.config import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ENV_VARS,
    INHERIT,
    ConfigError,
    NodeConfig,
    StaticPeer,
    TenantConfig,
    load_config,
)
from p2psync.replication.scope import SyncScope
from p2psync.state.quota import UNLIMITED, Limit, QuotaPolicy

ROOT = Path(__file__).resolve().parents[2]
DID_A = "did:key:z6MkexampleA"
DID_B = "did:key:z6MkexampleB"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path


def test_defaults_are_todays_serve() -> None:
    config = load_config(env={})
    assert config == NodeConfig()
    assert (config.host, config.port) == (DEFAULT_HOST, DEFAULT_PORT) == ("127.0.0.1", 4984)
    assert not config.discovery_enabled  # loopback: nothing to advertise
    assert config.metrics_port is None and not config.auto and not config.peers
    assert config.anti_entropy and config.anti_entropy_interval == 45  # every 30-60 s
    assert config.anti_entropy_jitter == pytest.approx(1 / 3) and config.anti_entropy_max_interval == 600
    [tenant] = config.tenants_for(DID_A)
    assert tenant == TenantConfig(DID_A, "both", (SyncScope.global_scope(),))
    # Tenants unbounded (the node stores only those its operator named); strangers' pushes
    # 10,000 messages and 256 MiB an hour each.
    assert config.quota_policy((tenant,)) == QuotaPolicy(
        tenant=UNLIMITED, tenants={}, peer=Limit(10_000, 256 * 2**20), window=3600)


def test_the_documented_example_parses() -> None:
    config = load_config(ROOT / "docs" / "examples" / "node.toml", env={})
    assert config.host == "0.0.0.0" and config.port == 4984
    assert config.discovery_enabled and config.auto and not config.private
    assert config.metrics_port == 9484 and config.metrics_host == "127.0.0.1"
    assert config.discovery_interfaces() is None  # 0.0.0.0: every interface
    assert [t.direction for t in config.tenants] == ["both", "pull"]
    assert config.tenants[0].did is None  # the node's own
    assert config.tenants[1].scopes == (SyncScope.for_protocol("https://example.org/protocols/notes"),
                                        SyncScope.subset("https://example.org/protocols/chat", ["thread"]))
    assert [p.url for p in config.peers] == ["wss://192.168.1.20:4984/_p2psync"]
    assert config.tls_enabled and not config.insecure  # 0.0.0.0 is not loopback
    assert config.anti_entropy and (config.anti_entropy_interval, config.anti_entropy_max_interval) == (45, 600)
    assert config.anti_entropy_jitter == 0.33
    policy = config.quota_policy(config.tenants_for(DID_A))
    assert policy.tenant == UNLIMITED and policy.peer == Limit(10_000, 256 * 2**20) and policy.window == 3600
    assert policy.tenants == {"did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK": Limit(100_000, 2 * 2**30)}


def test_precedence_flags_over_environment_over_file(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
data_dir = "data"
log_level = "info"
[listen]
host = "10.0.0.5"
port = 5000
[discovery]
auto = true
private = true
[metrics]
port = 9000
[[peer]]
url = "wss://10.0.0.6:4984/_p2psync"
[[tenant]]
did = "{DID_A}"
""")
    from_file = load_config(path, env={})
    assert from_file.host == "10.0.0.5" and from_file.port == 5000 and from_file.metrics_port == 9000
    assert from_file.data_dir == tmp_path / "data"  # relative to the file
    assert from_file.discovery_enabled and from_file.discovery_interfaces() == ["10.0.0.5"]
    env = {"P2PSYNC_PORT": "6000", "P2PSYNC_AUTO": "off", "P2PSYNC_PEERS": "wss://10.0.0.7:1/x, wss://10.0.0.8:1/x",
           "P2PSYNC_TENANTS": DID_B, "P2PSYNC_HOME": "/srv/p2p", "P2PSYNC_LOG_LEVEL": "debug"}
    from_env = load_config(path, env=env)
    assert from_env.port == 6000 and not from_env.auto and from_env.private  # the file's, not overridden
    assert [p.url for p in from_env.peers] == ["wss://10.0.0.7:1/x", "wss://10.0.0.8:1/x"]  # replaced, not merged
    assert from_env.tenants == (TenantConfig(DID_B),) and from_env.data_dir == Path("/srv/p2p")
    assert from_env.log_level == "debug"
    flags = {"port": "7000", "auto": True, "peers": ["wss://10.0.0.9:1/x"], "host": None, "private": False,
             "discovery": False}
    from_flags = load_config(path, env=env, flags=flags)
    assert from_flags.port == 7000 and from_flags.auto and not from_flags.private
    assert from_flags.host == "10.0.0.5"  # a flag not given leaves the lower layers' value
    assert from_flags.peers == (StaticPeer("wss://10.0.0.9:1/x"),)
    assert not from_flags.discovery_enabled


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "[listen]\nport = 4321\n")
    assert load_config(env={"P2PSYNC_CONFIG": str(path)}).port == 4321
    assert load_config(write(tmp_path, ""), env={"P2PSYNC_CONFIG": "/nonexistent"}).port == DEFAULT_PORT


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[listen]\nhots = 'x'\n", "node.toml: listen.hots: unknown key"),
        ("colour = 'blue'\n", "node.toml: colour: unknown key"),
        ("[listen]\nport = 70000\n", "node.toml: listen.port: must be a TCP port 0-65535"),
        ("[listen]\nport = '80'\n", "node.toml: listen.port: must be an integer (without quotes)"),
        ("[discovery]\nauto = 'yes please'\n", "node.toml: discovery.auto: must be true or false"),
        ("[discovery]\ninterfaces = ['eth0']\n", "node.toml: discovery.interfaces: must be an IP address"),
        ("log_level = 'loud'\n", "node.toml: log_level: must be one of debug, info, warning, error"),
        ("name = '" + "x" * 64 + "'\n", "node.toml: name: must be at most 63 bytes"),
        ("listen = 5\n", "node.toml: listen: must be a table"),
        ("[[tenant]]\ndid = 'alice'\n", "node.toml: tenant[0].did: 'alice' is not a DID"),
        ("[[tenant]]\ndirection = 'sideways'\n", "node.toml: tenant[0].direction: must be pull, push or both"),
        ("[[tenant]]\nscopes = []\n", "node.toml: tenant[0].scopes: must name at least one scope"),
        ("[[tenant]]\nscopes = ['global', 'global']\n",
         "node.toml: tenant[0].scopes[1]: the same scope as tenant[0].scopes[0] (scopeId bafyrei"),
        ("[[tenant]]\nscopes = [{ protocol = 'https://x.org/p', depth = 2 }]\n",
         "node.toml: tenant[0].scopes[0]: unknown key 'depth' in a scope"),
        # A subset scope: each entry is named, with the scope rules' own code and reason.
        ("[[tenant]]\nscopes = ['global', { protocol = 'https://x.org/p', protocol_path_prefixes = ['a//b'] }]\n",
         "node.toml: tenant[0].scopes[1]: SyncScopeInvalid: protocolPathPrefixes entry 'a//b' has an empty segment"),
        ("[[tenant]]\nscopes = [{ protocol = 'https://x.org/p', context_id_prefixes = ['thread'] }]\n",
         "node.toml: tenant[0].scopes[0]: SyncScopeInvalid: contextIdPrefixes entry 'thread': 'thread' is not a "
         "recordId (CID)"),
        ("[[tenant]]\nscopes = [{ protocol_path_prefixes = ['thread'] }]\n",
         "node.toml: tenant[0].scopes[0]: a scope table needs protocol"),
        ("[[tenant]]\nscopes = [{ protocol = 'https://x.org/p', protocolPathPrefixes = ['thread'] }]\n",
         "node.toml: tenant[0].scopes[0]: unknown key 'protocolPathPrefixes' in a scope "
         "(write protocol_path_prefixes)"),
        # Two spellings of one scope (a covered prefix, another order) are one scopeId.
        ("[[tenant]]\nscopes = [{ protocol = 'https://x.org/p', protocol_path_prefixes = ['a', 'b'] },\n"
         "  { protocol = 'https://x.org/p/', protocol_path_prefixes = ['b', 'a/c', 'a'] }]\n",
         "node.toml: tenant[0].scopes[1]: the same scope as tenant[0].scopes[0]"),
        ("[[tenant]]\nscopes = [{ protocol = 'https://x.org/p' }, 'https://x.org/p']\n",
         "node.toml: tenant[0].scopes[1]: the same scope as tenant[0].scopes[0]"),
        ("[[tenant]]\ncolour = 1\n", "node.toml: tenant[0].colour: unknown key"),
        ("[[peer]]\ntenants = []\n", "node.toml: peer[0].url: is required"),
        ("[[peer]]\nurl = 'http://x:1/'\n", "node.toml: peer[0].url: http://x:1/ is not a wss:// or ws:// URL"),
        ("[[peer]]\nurl = 'wss://x:1/'\npin = 'AA'\n", "node.toml: peer[0].pin: 'AA' is not a certificate fingerprint"),
        ("[[peer]]\nurl = 'wss://x:1/'\n[[peer]]\nurl = 'wss://x:1/'\n", "node.toml: peer: wss://x:1/ is listed twice"),
        ("tenant = 3\n", "node.toml: tenant: must be an array of tables ([[tenant]])"),
        ("[anti_entropy]\nintervall = 30\n", "node.toml: anti_entropy.intervall: unknown key"),
        ("[anti_entropy]\ninterval = 0.1\n", "node.toml: anti_entropy.interval: must be at least 1 second(s)"),
        ("[anti_entropy]\ninterval = '45'\n", "node.toml: anti_entropy.interval: must be a number (without quotes)"),
        ("[anti_entropy]\ninterval = true\n", "node.toml: anti_entropy.interval: must be a number, not True"),
        ("[anti_entropy]\njitter = 1.0\n", "node.toml: anti_entropy.jitter: must be a fraction from 0 to below 1"),
        ("[anti_entropy]\njitter = -0.1\n", "node.toml: anti_entropy.jitter: must be a fraction from 0 to below 1"),
        ("[anti_entropy]\nmax_interval = inf\n", "node.toml: anti_entropy.max_interval: must be a number, not inf"),
        ("[anti_entropy]\nenabled = 'no'\n", "node.toml: anti_entropy.enabled: must be true or false (without"),
        ("anti_entropy = 45\n", "node.toml: anti_entropy: must be a table"),
        ("[quota]\ntenant_msgs = 5\n", "node.toml: quota.tenant_msgs: unknown key"),
        ("[quota]\ntenant_messages = -1\n", "node.toml: quota.tenant_messages: must be a whole number of messages"),
        ("[quota]\ntenant_messages = 2.5\n", "node.toml: quota.tenant_messages: must be a whole number of messages"),
        ("[quota]\ntenant_messages = '1000'\n",
         "node.toml: quota.tenant_messages: must be an integer (without quotes) or \"unlimited\""),
        ("[quota]\ntenant_messages = 'lots'\n", "node.toml: quota.tenant_messages: must be an integer"),
        ("[quota]\ntenant_bytes = '10 parsecs'\n", "node.toml: quota.tenant_bytes: must be a size in bytes"),
        ("[quota]\npeer_bytes = -5\n", "node.toml: quota.peer_bytes: must be a size in bytes"),
        ("[quota]\npeer_bytes = true\n", "node.toml: quota.peer_bytes: must be a size in bytes"),
        ("[quota]\npeer_window = 0\n", "node.toml: quota.peer_window: must be at least 1 second"),
        ("[quota]\npeer_window = '1h'\n", "node.toml: quota.peer_window: must be a number (without quotes)"),
        ("[[tenant]]\nquota_messages = -3\n", "node.toml: tenant[0].quota_messages: must be a whole number"),
        ("[[tenant]]\nquota_bytes = '5 lightyears'\n", "node.toml: tenant[0].quota_bytes: must be a size in bytes"),
        ("[listen\n", "node.toml: not valid TOML"),
    ],
)
def test_file_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert str(info.value).startswith(f"{tmp_path}/{message}"), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[peer]]\nurl = 'ws://x:1/'\n", "configuration: peer[0].url: ws://x:1/ is plain ws:// to another host"),
        ("[[peer]]\nurl = 'ws://127.0.0.1:1/'\npin = '" + "A" * 43 + "'\n",
         "configuration: peer[0].pin: a certificate pin needs a wss:// URL"),
        ("[listen]\nhost = '0.0.0.0'\ntls = false\n", "configuration: listen.tls: plain ws:// on 0.0.0.0"),
    ],
)
def test_plain_ws_beyond_loopback_is_refused_without_insecure(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert str(info.value).startswith(message), str(info.value)
    if "pin" not in text:  # insecure allows plain ws://, never a pin without TLS
        config = load_config(write(tmp_path, text + "[listen]\ninsecure = true\n" if "[listen]" not in text
                                   else text + "insecure = true\n"), env={})
        assert config.insecure


def test_tls_is_on_beyond_loopback_by_default(tmp_path: Path) -> None:
    assert not load_config(env={}).tls_enabled  # 127.0.0.1
    assert load_config(env={"P2PSYNC_HOST": "0.0.0.0"}).tls_enabled
    assert load_config(env={"P2PSYNC_TLS": "on"}).tls_enabled
    config = load_config(write(tmp_path, "[[peer]]\nurl = 'wss://10.0.0.2:4984/_p2psync'\npin = '" + "B" * 43 + "'\n"),
                         env={})
    assert config.peers[0].pin == "B" * 43


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"P2PSYNC_PORT": "http"}, "environment: P2PSYNC_PORT: must be a TCP port"),
        ({"P2PSYNC_DISCOVERY": "maybe"}, "environment: P2PSYNC_DISCOVERY: must be true or false"),
        ({"P2PSYNC_PEERS": "wss://a:1/ ftp://b/"}, "environment: P2PSYNC_PEERS: ftp://b/ is not a wss:// or ws:// URL"),
        ({"P2PSYNC_TENANTS": "did:x:1,bob"}, "environment: P2PSYNC_TENANTS: 'bob' is not a DID"),
        ({"P2PSYNC_METRICS_PORT": "-1"}, "environment: P2PSYNC_METRICS_PORT: must be a TCP port"),
        ({"P2PSYNC_ANTI_ENTROPY": "sometimes"}, "environment: P2PSYNC_ANTI_ENTROPY: must be true or false"),
        ({"P2PSYNC_ANTI_ENTROPY_INTERVAL": "often"}, "environment: P2PSYNC_ANTI_ENTROPY_INTERVAL: must be a number"),
        ({"P2PSYNC_ANTI_ENTROPY_JITTER": "2"}, "environment: P2PSYNC_ANTI_ENTROPY_JITTER: must be a fraction"),
        ({"P2PSYNC_QUOTA_TENANT_MESSAGES": "many"}, "environment: P2PSYNC_QUOTA_TENANT_MESSAGES: must be a whole"),
        ({"P2PSYNC_QUOTA_PEER_BYTES": "1 XB"}, "environment: P2PSYNC_QUOTA_PEER_BYTES: must be a size in bytes"),
        ({"P2PSYNC_QUOTA_PEER_WINDOW": "soon"}, "environment: P2PSYNC_QUOTA_PEER_WINDOW: must be a number"),
    ],
)
def test_environment_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
        load_config(env=env)


def test_flag_errors_name_the_flag_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^command line: --metrics-port: must be a TCP port"):
        load_config(env={}, flags={"metrics_port": "lots"})
    with pytest.raises(ConfigError, match=r"^command line: --peer: ws://a:1/ is listed twice"):
        load_config(env={}, flags={"peers": ["ws://a:1/", "ws://a:1/"]})
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot read it: No such file"):
        load_config(tmp_path / "nope.toml", env={})


def test_tenants_resolve_and_static_peers_must_name_synced_tenants() -> None:
    config = NodeConfig(tenants=(TenantConfig(), TenantConfig(DID_B, "pull")),
                        peers=(StaticPeer("ws://x:1/", (DID_B,)),))
    assert [t.did for t in config.tenants_for(DID_A)] == [DID_A, DID_B]
    with pytest.raises(ConfigError, match=r"tenant: did:key:z6MkexampleA is listed twice"):
        NodeConfig(tenants=(TenantConfig(), TenantConfig(DID_A))).tenants_for(DID_A)
    with pytest.raises(ConfigError, match=r"peer\[0\]\.tenants: did:key:z6MkexampleB is not one of the node's"):
        NodeConfig(peers=(StaticPeer("ws://x:1/", (DID_B,)),)).tenants_for(DID_A)


def test_every_environment_variable_is_documented() -> None:
    guide = (ROOT / "docs" / "operator.md").read_text()
    for name in ENV_VARS:
        assert f"`{name}`" in guide, name


def test_anti_entropy_settings_by_layer_and_checked_together(tmp_path: Path) -> None:
    path = write(tmp_path, "[anti_entropy]\ninterval = 30\njitter = 0\nmax_interval = 120\n")
    config = load_config(path, env={})
    assert (config.anti_entropy, config.anti_entropy_interval, config.anti_entropy_jitter,
            config.anti_entropy_max_interval) == (True, 30, 0, 120)
    env = {"P2PSYNC_ANTI_ENTROPY": "off", "P2PSYNC_ANTI_ENTROPY_INTERVAL": "90.5",
           "P2PSYNC_ANTI_ENTROPY_MAX_INTERVAL": "900"}
    config = load_config(path, env=env)
    assert not config.anti_entropy and config.anti_entropy_interval == 90.5
    assert config.anti_entropy_max_interval == 900 and config.anti_entropy_jitter == 0  # the file's
    # Each value may be fine on its own and wrong together: checked once the layers are merged.
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "[anti_entropy]\nmax_interval = 30\n"), env={})
    assert str(info.value) == ("configuration: anti_entropy.max_interval: must be at least anti_entropy.interval "
                               "(45), not 30")
    with pytest.raises(ConfigError, match=r"must be at least anti_entropy.interval \(120\), not 60"):
        load_config(path, env={"P2PSYNC_ANTI_ENTROPY_INTERVAL": "120", "P2PSYNC_ANTI_ENTROPY_MAX_INTERVAL": "60"})


def test_quota_settings_by_layer_and_per_tenant(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
[quota]
tenant_messages = 1_000
tenant_bytes = "1.5 GiB"
peer_messages = "unlimited"
peer_bytes = 0
peer_window = 600

[[tenant]]

[[tenant]]
did = "{DID_B}"
quota_messages = "unlimited"

[[tenant]]
did = "did:key:z6MkexampleC"
quota_bytes = 5000000
""")
    config = load_config(path, env={})
    tenants = config.tenants_for(DID_A)
    assert tenants[0].quota_messages is INHERIT and tenants[1].quota_bytes is INHERIT
    policy = config.quota_policy(tenants)
    assert policy.tenant == Limit(1000, int(1.5 * 2**30))
    assert policy.tenants == {DID_B: Limit(None, int(1.5 * 2**30)), "did:key:z6MkexampleC": Limit(1000, 5_000_000)}
    assert policy.for_tenant(DID_A) == policy.tenant  # the node's own: the default
    assert policy.peer == Limit(None, 0) and policy.window == 600  # strangers may push nothing
    env = {"P2PSYNC_QUOTA_TENANT_MESSAGES": "unlimited", "P2PSYNC_QUOTA_TENANT_BYTES": "10 GB",
           "P2PSYNC_QUOTA_PEER_MESSAGES": "50", "P2PSYNC_QUOTA_PEER_BYTES": "64MiB",
           "P2PSYNC_QUOTA_PEER_WINDOW": "3600"}
    policy = load_config(path, env=env).quota_policy(tenants)
    assert policy.tenant == Limit(None, 10**10) and policy.peer == Limit(50, 64 * 2**20) and policy.window == 3600


def test_a_node_checks_a_configuration_built_by_hand(tmp_path: Path) -> None:
    from p2psync.node.node import Node
    from tests.peer.support import new_store, seeded

    config = NodeConfig(anti_entropy_interval=60, anti_entropy_max_interval=30)
    with pytest.raises(ConfigError, match=r"anti_entropy.max_interval: must be at least"):
        Node(config, new_store(tmp_path, "n"), seeded("config-by-hand"))
    # and runs its peer with the quotas it sets
    identity = seeded("config-by-hand")
    config = NodeConfig(tenants=(TenantConfig(quota_messages=7),), quota_peer_window=60)
    node = Node(config, new_store(tmp_path, "q"), identity)
    assert node.peer.quotas is not None
    assert node.peer.quotas.policy.for_tenant(identity.did) == Limit(7, None)
    assert node.peer.quotas.policy.window == 60
