-- p2psync.lua: let Wireshark decode p2psync replication traffic.
--
-- p2psync speaks BLIP_3 over a WebSocket whose negotiated subprotocol is "BLIP_3+P2PSync_1"
-- (protocol/replication-profiles.md §2). Wireshark already has a BLIP dissector,
-- but it registers itself only for Couchbase Mobile's subprotocols ("BLIP_3+CBMobile_2",
-- "BLIP_3+CBMobile_3" in 4.0). The WebSocket dissector looks the value of the
-- handshake's Sec-WebSocket-Protocol header up in the "ws.protocol" dissector table and hands
-- each message's payload to what it finds there, so adding our subprotocol to that table is all
-- it takes: the framing is the same BLIP_3, only the profiles on top are ours.
--
-- Load it for one run:   tshark -X lua_script:protocol/wireshark/p2psync.lua ...
-- or for every run:      copy it to ~/.local/lib/wireshark/plugins/ (Wireshark 4.x;
--                        "Personal Lua Plugins" in Help > About > Folders, or `tshark -G folders`)
--
-- It adds no decode-as rules of its own: TLS and HTTP-inside-TLS are found by Wireshark's
-- heuristics on any port, and claiming a TCP port (4984, say) for HTTP would hide TLS on it.
-- See protocol/wireshark/README.md for decrypting wss:// with a key log.

-- Bump together with the subprotocol (replication-profiles.md §15); older ones can stay listed.
local SUBPROTOCOLS = { "BLIP_3+P2PSync_1" }

local ok, blip = pcall(Dissector.get, "blip")
if not ok or blip == nil then
    -- Say why nothing decodes, instead of failing with a Lua stack trace at start-up.
    error("p2psync.lua: this Wireshark has no BLIP dissector (\"blip\"); try a newer one")
end

local websocket_subprotocols = DissectorTable.get("ws.protocol")
for _, name in ipairs(SUBPROTOCOLS) do
    websocket_subprotocols:add(name, blip)
end
