"""The sans-I/O BLIP state machine: numbering, framing, outbox, flow control, errors."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2psync.blip.codec import FrameEncoder
from p2psync.blip.connection import (
    BlipConnection,
    ConnectionState,
    FrameIgnored,
    MessageData,
    MessageFailed,
    MessageStart,
)
from p2psync.blip.errors import ConnectionClosed, ProtocolError
from p2psync.blip.wire import (
    ACK_INTERVAL,
    ACK_MSG,
    ACK_RPY,
    BIG_FRAME_SIZE,
    BULK_REPLY_BYTES,
    COMPRESSED,
    ERR,
    FRAME_SIZE,
    MAX_UNACKED_BYTES,
    MORE_COMING,
    MSG,
    NO_REPLY,
    RPY,
    TYPE_MASK,
    URGENT,
    WIDE_UNACKED_BYTES,
    decode_uvarint,
    encode_message_head,
    frame_header,
    parse_frame_header,
)

from .conftest import assemble, pump

property_text = st.text(st.characters(blacklist_characters="\0", codec="utf-8"), max_size=12)
message_spec = st.tuples(
    st.dictionaries(property_text, property_text, max_size=4),
    st.binary(max_size=2000) | st.sampled_from([b"", b"z" * 9000, bytes(range(256)) * 80]),
    st.booleans(),  # urgent
    st.booleans(),  # compressed
    st.booleans(),  # no reply
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(message_spec, min_size=1, max_size=6))
def test_any_messages_round_trip(
    specs: list[tuple[dict[str, str], bytes, bool, bool, bool]],
) -> None:
    a, b = BlipConnection(), BlipConnection()
    for props, body, urgent, compressed, no_reply in specs:
        a.send_request(props, body, urgent=urgent, compressed=compressed, no_reply=no_reply)
    events = []
    while a.wants_to_send or b.wants_to_send:
        events += pump(a, b, max_bytes=20_000)
        pump(b, a)  # ACKs back
    got = assemble(events)
    assert len(got) == len(specs)
    for number, (props, body, urgent, compressed, no_reply) in enumerate(specs, start=1):
        g_props, g_body, g_flags = got[(MSG, number)]
        assert (g_props, g_body) == (props, body)
        assert bool(g_flags & URGENT) == urgent
        assert bool(g_flags & COMPRESSED) == compressed
        assert bool(g_flags & NO_REPLY) == no_reply


def test_request_numbers_and_reply_numbers() -> None:
    a, b = BlipConnection(), BlipConnection()
    assert [a.send_request({"Profile": "p"}, b"") for _ in range(3)] == [1, 2, 3]
    events = pump(a, b)
    assert [(e.type, e.number) for e in events if isinstance(e, MessageStart)] == [
        (MSG, 1),
        (MSG, 2),
        (MSG, 3),
    ]
    # Requests in the other direction are numbered separately.
    assert b.send_request({"Profile": "q"}) == 1
    b.send_reply(2, {"A": "b"}, b"two")
    b.send_error(1, "Dom", 7, "bad")
    got = {(e.type, e.number): e for e in pump(b, a) if isinstance(e, MessageStart)}
    assert set(got) == {(MSG, 1), (RPY, 2), (ERR, 1)}
    assert got[(MSG, 1)].properties == {"Profile": "q"}
    assert got[(RPY, 2)].body == b"two" and got[(RPY, 2)].properties == {"A": "b"}
    assert got[(ERR, 1)].properties == {"Error-Domain": "Dom", "Error-Code": "7"}
    assert got[(ERR, 1)].body == b"bad"


def test_single_frame_request_bytes() -> None:
    a = BlipConnection()
    a.send_request({"Profile": "echo"}, b"hi")
    (frame,) = a.frames_to_send()
    head = encode_message_head({"Profile": "echo"})
    assert head == b"\x0dProfile\0echo\0"
    assert frame[:2] == b"\x01\x00"  # message 1, MSG, no flags
    assert frame[2:-4] == head + b"hi"


def test_replying_twice_or_to_a_no_reply_request_is_refused() -> None:
    a, b = BlipConnection(), BlipConnection()
    a.send_request({"Profile": "x"}, no_reply=True)
    a.send_request({"Profile": "y"})
    pump(a, b)
    with pytest.raises(ValueError, match="wants no reply"):
        b.send_reply(1, {})
    b.send_reply(2, {})
    with pytest.raises(ValueError, match="wants no reply"):
        b.send_reply(2, {})
    with pytest.raises(ValueError, match="wants no reply"):
        b.send_reply(99, {})


def frame_sizes(conn: BlipConnection) -> list[tuple[int, int, int]]:
    out = []
    for frame in conn.frames_to_send(1 << 30):
        number, flags, _ = parse_frame_header(frame)
        out.append((number, flags, len(frame)))
    return out


def test_frame_size_is_big_when_nothing_else_waits() -> None:
    a = BlipConnection()
    a.send_request({}, b"x" * 100_000)
    sizes = frame_sizes(a)
    assert sizes[0][2] == BIG_FRAME_SIZE
    assert all(flags & MORE_COMING for _, flags, _ in sizes[:-1])
    assert not sizes[-1][1] & MORE_COMING


def test_frames_are_small_while_others_wait_and_big_when_urgent() -> None:
    a = BlipConnection()
    a.send_request({}, b"x" * 30_000)
    a.send_request({}, b"y" * 30_000)
    a.send_request({}, b"z" * 30_000, urgent=True)
    sizes = frame_sizes(a)
    normal = [size for number, flags, size in sizes if number in (1, 2) and flags & MORE_COMING]
    urgent = [size for number, flags, size in sizes if number == 3 and flags & MORE_COMING]
    assert normal and all(size <= FRAME_SIZE for size in normal)
    assert urgent and all(size == BIG_FRAME_SIZE for size in urgent)


def test_round_robin_lets_small_messages_pass_a_large_one() -> None:
    a = BlipConnection()
    a.send_request({}, b"L" * 200_000)
    for _ in range(5):
        a.send_request({}, b"s")
    order = [number for number, _, _ in frame_sizes(a)]
    # One frame of the large message, then all the small ones, then the rest of it.
    assert order[:6] == [1, 2, 3, 4, 5, 6]
    assert set(order[6:]) == {1}


def test_urgent_messages_go_first_but_never_starve_normal_ones() -> None:
    a = BlipConnection()
    a.send_request({}, b"n" * 60_000)
    a.send_request({}, b"u" * 60_000, urgent=True)
    a.send_request({}, b"v" * 60_000, urgent=True)
    order = [number for number, _, _ in frame_sizes(a)]
    # Once all three are under way, the normal message gets a frame between urgent ones.
    middle = order[3:12]
    assert 1 in middle
    for i in range(len(order) - 2):
        window = order[i : i + 3]
        if 1 in order[i + 3 :]:  # the normal message still has frames to send
            assert 1 in window, order
    assert order.index(2) < order.index(3)


def test_a_new_message_never_starts_before_an_older_unstarted_one() -> None:
    a = BlipConnection()
    a.send_request({}, b"a" * 50_000)
    a.frames_to_send(1)  # message 1 has begun
    a.send_request({}, b"b")  # 2: new, normal
    a.send_request({}, b"c", urgent=True)  # 3: urgent, but must not overtake 2
    order = [number for number, _, _ in frame_sizes(a)]
    assert order.index(2) < order.index(3)


def test_bulk_replies_go_one_after_another_in_the_order_they_were_queued() -> None:
    """Large replies do not share the outbox's turns (each would finish late, in small frames):
    the second begins after the last frame of the first, in big frames; a small reply and a
    request still pass them, and a bulk reply queued behind is not lost on close."""
    a, b = BlipConnection(), BlipConnection()
    for _ in range(4):
        a.send_request({"Profile": "getAttachment"}, b"?")
    pump(a, b)
    size = 3 * BULK_REPLY_BYTES
    b.send_window = 1 << 30  # no ACKs here: the window is not what this is about
    b.send_reply(1, {}, b"1" * size)
    b.send_reply(2, {}, b"2" * size)
    b.send_reply(3, {}, b"s" * 100)  # small: takes its turn as ever
    b.send_reply(4, {}, b"4" * size)
    frames = b.frames_to_send(1 << 30)
    sizes = [(*parse_frame_header(frame)[:2], len(frame)) for frame in frames]
    order = [number for number, _, _ in sizes]
    assert 3 in order[:3]
    last = {n: max(i for i, m in enumerate(order) if m == n) for n in (1, 2, 4)}
    first = {n: order.index(n) for n in (1, 2, 4)}
    assert last[1] < first[2] and last[2] < first[4], order
    bulk = [size for number, flags, size in sizes if number != 3 and flags & MORE_COMING]
    assert sum(s == BIG_FRAME_SIZE for s in bulk) > len(bulk) - 3  # big frames, but beside #3
    events = [event for frame in frames for event in a.receive_message(frame)]
    received = assemble(events)
    assert [received[(RPY, n)][1] for n in (1, 2, 4)] == [b"1" * size, b"2" * size, b"4" * size]


def test_a_bulk_reply_below_the_line_or_urgent_or_streamed_is_not_held_back() -> None:
    a, b = BlipConnection(), BlipConnection()
    for _ in range(4):
        a.send_request({"Profile": "x"}, b"?")
    pump(a, b)
    b.send_window = 1 << 30
    b.send_reply(1, {}, b"1" * 2 * BULK_REPLY_BYTES)
    b.send_reply(2, {}, b"2" * (BULK_REPLY_BYTES - 100))
    b.send_reply(3, {}, b"3" * 2 * BULK_REPLY_BYTES, urgent=True)
    b.send_reply(4, {}, b"4" * 1000, more_body=True)
    b.append_body(RPY, 4, b"4" * 2 * BULK_REPLY_BYTES, end=True)
    order = [number for number, _, _ in frame_sizes(b)]
    assert set(order[:8]) == {1, 2, 3, 4}


def test_closing_forgets_bulk_replies_queued_behind() -> None:
    a, b = BlipConnection(), BlipConnection()
    for _ in range(2):
        a.send_request({"Profile": "x"}, b"?")
    pump(a, b)
    b.send_reply(1, {}, b"1" * 2 * BULK_REPLY_BYTES)
    b.send_reply(2, {}, b"2" * 2 * BULK_REPLY_BYTES)
    assert b.queued_messages == 2
    b.close()
    assert b.frames_to_send(1 << 30) == [] and b.queued_messages == 0 and not b.wants_to_send


def test_sender_pauses_at_the_window_and_an_ack_resumes_it() -> None:
    a = BlipConnection()
    number = a.send_request({}, b"q" * 1_000_000)
    a.frames_to_send(1 << 30)
    progress = a.outgoing_progress(MSG, number)
    assert progress is not None
    sent, acked, paused = progress
    assert paused and acked == 0
    assert MAX_UNACKED_BYTES < sent <= MAX_UNACKED_BYTES + BIG_FRAME_SIZE
    assert not a.wants_to_send and a.frames_to_send() == []
    # An ACK for most of it lets the message go on.
    ack = FrameEncoder.encode_ack(number, ACK_MSG | URGENT | NO_REPLY, sent - 1000)
    assert a.receive_message(ack) == []
    assert a.wants_to_send
    assert a.outgoing_progress(MSG, number) == (sent, sent - 1000, False)


def test_a_wider_window_lets_more_go_before_the_pause() -> None:
    a = BlipConnection()
    a.send_window = WIDE_UNACKED_BYTES  # what a peer sets once both hellos offered it
    number = a.send_request({}, b"q" * 3_000_000)
    a.frames_to_send(1 << 30)
    progress = a.outgoing_progress(MSG, number)
    assert progress is not None
    sent, _, paused = progress
    assert paused and WIDE_UNACKED_BYTES < sent <= WIDE_UNACKED_BYTES + BIG_FRAME_SIZE


def test_receiver_acks_every_50000_bytes_with_urgent_noreply_ack_frames() -> None:
    a, b = BlipConnection(), BlipConnection()
    a.send_request({}, b"w" * 400_000)
    acks: list[tuple[int, int, int]] = []
    while a.wants_to_send:
        for frame in a.frames_to_send(FRAME_SIZE):  # one frame at a time
            b.receive_message(frame)
            for ack in b.frames_to_send():
                number, flags, pos = parse_frame_header(ack)
                acks.append((number, flags, decode_uvarint(ack, pos)[0]))
                a.receive_message(ack)
    assert acks, "a 400 kB message must be acknowledged"
    assert all(flags == ACK_MSG | URGENT | NO_REPLY and number == 1 for number, flags, _ in acks)
    counts = [count for _, _, count in acks]
    assert counts == sorted(counts)
    # One ACK per multiple of 50,000 crossed (none at the final frame), each sent at once.
    assert [c // ACK_INTERVAL for c in counts] == list(range(1, len(counts) + 1))
    assert all(c % ACK_INTERVAL <= BIG_FRAME_SIZE for c in counts)


def test_manual_credit_holds_acks_until_the_consumer_reads() -> None:
    a, b = BlipConnection(), BlipConnection()
    a.send_request({}, b"m" * 600_000)
    frames = a.frames_to_send(1 << 30)  # everything up to the window; then a pauses
    (start,) = b.receive_message(frames[0])
    assert isinstance(start, MessageStart) and not start.complete
    b.use_manual_credit(MSG, 1)
    data = [event for frame in frames[1:] for event in b.receive_message(frame)]
    assert sum(len(f) for f in frames) > 2 * ACK_INTERVAL
    assert not b.wants_to_send  # received, but nothing consumed: no ACK
    credited, crossings = len(frames[0]) - 2, []
    for event in data:
        assert isinstance(event, MessageData)
        before, credited = credited, credited + event.size
        b.credit(MSG, 1, event.size)
        if before // ACK_INTERVAL != credited // ACK_INTERVAL:
            crossings.append(credited)
    acks = b.frames_to_send()
    # One ACK per crossing of a multiple of ACK_INTERVAL, each with the count at that crossing.
    counts = []
    for ack in acks:
        number, flags, pos = parse_frame_header(ack)
        counts.append(decode_uvarint(ack, pos)[0])
    assert counts == crossings and len(counts) >= 2
    for ack in acks:
        a.receive_message(ack)
    assert a.wants_to_send  # the sender resumes


def test_queued_reply_bytes_count_our_replies_until_they_are_framed() -> None:
    """What a peer that asks and never reads makes us hold: replies and errors, properties and
    body, streamed or not, until framed; not our own requests; nothing once closed."""
    a, b = BlipConnection(), BlipConnection()
    for _ in range(4):
        a.send_request({"Profile": "ask"}, b"?")
    pump(a, b)
    b.send_reply(1, {}, b"r" * 300_000)
    b.send_error(2, "BLIP", 404, "no handler")
    b.send_reply(3, {}, b"s" * 10, more_body=True)
    b.append_body(RPY, 3, b"t" * 20, end=False)
    owed = 300_000 + 1 + 10 + 1 + 20 + len(encode_message_head({"Error-Domain": "BLIP", "Error-Code": "404"})) + 10
    assert b.queued_reply_bytes == owed
    b.send_request({"Profile": "ours"}, b"q" * 50_000)
    assert b.queued_reply_bytes == owed
    framed = b.frames_to_send(1 << 30)  # up to the window of the large one, the rest whole
    assert 0 < b.queued_reply_bytes < 300_000 - MAX_UNACKED_BYTES
    b.send_reply(4, {}, b"u" * 100)
    b.close()
    assert b.queued_reply_bytes == 0
    assert b.bytes_sent == sum(len(frame) for frame in framed)


def test_bytes_received_count_what_frames_inflate_to() -> None:
    a, b = BlipConnection(), BlipConnection()
    a.send_request({"Profile": "z"}, bytes(100_000), compressed=True)
    frames = a.frames_to_send(1 << 30)
    for frame in frames:
        b.receive_message(frame)
    wire = sum(len(frame) for frame in frames)
    assert a.bytes_sent == wire
    assert b.bytes_received > 100_000 > 10 * wire


def test_streamed_body_is_framed_as_it_is_appended() -> None:
    a, b = BlipConnection(), BlipConnection()
    number = a.send_request({"Profile": "up"}, more_body=True)
    events = pump(a, b)
    assert isinstance(events[0], MessageStart) and not events[0].complete
    assert not a.wants_to_send  # waiting for body data
    assert a.outgoing_backlog(MSG, number) == 0
    a.append_body(MSG, number, b"part1", end=False)
    a.append_body(MSG, number, b"part2", end=False)
    assert a.outgoing_backlog(MSG, number) == 10
    events += pump(a, b)
    a.append_body(MSG, number, b"", end=True)
    events += pump(a, b)
    assert a.outgoing_backlog(MSG, number) is None
    assert assemble(events)[(MSG, number)][1] == b"part1part2"
    assert a.take_finished() == [(MSG, number)]
    with pytest.raises(ValueError):
        a.append_body(MSG, number, b"late", end=True)


# --- errors ---


def fatal(conn: BlipConnection, frame: bytes | str, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        conn.receive_message(frame)
    assert conn.state is ConnectionState.ERROR
    with pytest.raises(ProtocolError):
        conn.receive_message(b"\x01\x00")
    with pytest.raises(ConnectionClosed):
        conn.send_request({})


def test_text_message_is_fatal() -> None:
    fatal(BlipConnection(), "hello", "text")


def test_empty_frame_is_fatal() -> None:
    fatal(BlipConnection(), b"", "empty")


def test_bad_varint_is_fatal() -> None:
    fatal(BlipConnection(), b"\xff" * 11, "varint")


def test_request_out_of_sequence_is_fatal() -> None:
    fatal(BlipConnection(), FrameEncoder().encode(2, MSG, b"\x00"), "out of sequence")


def test_reply_to_a_request_never_sent_is_fatal() -> None:
    fatal(BlipConnection(), FrameEncoder().encode(1, RPY, b"\x00"), "never sent")


def test_crc_mismatch_is_fatal() -> None:
    frame = bytearray(FrameEncoder().encode(1, MSG, b"\x00abc"))
    frame[-1] ^= 0xFF
    fatal(BlipConnection(), bytes(frame), "checksum")


def test_bad_deflate_is_fatal() -> None:
    frame = frame_header(1, MSG | COMPRESSED) + b"\xfe\xfe\xfe" + b"\0\0\0\0"
    fatal(BlipConnection(), frame, "deflate")


def test_unknown_frame_type_is_skipped() -> None:
    b = BlipConnection()
    (event,) = b.receive_message(frame_header(1, 3) + b"anything")
    assert isinstance(event, FrameIgnored) and "unknown" in event.reason
    assert b.state is ConnectionState.OPEN


def test_unknown_flag_bits_are_ignored() -> None:
    a, b = BlipConnection(), BlipConnection()
    encoder = FrameEncoder()
    frame = encoder.encode(1, MSG | 0x80, encode_message_head({"k": "v"}) + b"body")
    (event,) = b.receive_message(frame)
    assert isinstance(event, MessageStart)
    assert (event.properties, event.body, event.complete) == ({"k": "v"}, b"body", True)
    del a


def test_frame_for_a_finished_message_is_skipped() -> None:
    a, b = BlipConnection(), BlipConnection()
    a.send_request({}, b"x")
    (frame,) = a.frames_to_send()
    b.receive_message(frame)
    # The same request number again, with a CRC that fits the stream so far.
    encoder = FrameEncoder()
    encoder.encode(1, MSG, frame[2:-4])
    again = encoder.encode(1, MSG, b"\x00late")
    (event,) = b.receive_message(again)
    assert isinstance(event, FrameIgnored) and "finished" in event.reason
    # So is a reply to a request that wanted none.
    a = BlipConnection()
    a.send_request({}, no_reply=True)
    (event,) = a.receive_message(FrameEncoder().encode(1, RPY, b"\x00"))
    assert isinstance(event, FrameIgnored) and "no reply" in event.reason


def test_malformed_properties_skip_the_message_and_answer_400() -> None:
    b = BlipConnection()
    encoder = FrameEncoder()
    bad = encoder.encode(1, MSG, b"\x03a\0b")  # length 3 but no final NUL
    (event,) = b.receive_message(bad)
    assert isinstance(event, MessageFailed) and "malformed" in event.reason
    reply_frames = b.frames_to_send()
    assert len(reply_frames) == 1
    number, flags, _ = parse_frame_header(reply_frames[0])
    assert (number, flags & TYPE_MASK) == (1, ERR)
    # The connection goes on: request 2 is fine.
    (event,) = b.receive_message(encoder.encode(2, MSG, b"\x00ok"))
    assert isinstance(event, MessageStart) and event.body == b"ok"


def test_malformed_multi_frame_message_is_swallowed() -> None:
    a, b = BlipConnection(), BlipConnection()
    a.send_request({}, b"y" * 20_000, no_reply=True)
    frames = a.frames_to_send()
    # Rewrite the first frame's properties length to something absurd, keeping CRCs valid.
    encoder = FrameEncoder()
    rebuilt = []
    for i, frame in enumerate(frames):
        number, flags, pos = parse_frame_header(frame)
        body = frame[pos:-4]
        if i == 0:
            body = b"\xff\xff\xff\x7f" + body[1:]
        rebuilt.append(encoder.encode(number, flags, body))
    events = [e for f in rebuilt for e in b.receive_message(f)]
    assert len(events) == 1 and isinstance(events[0], MessageFailed)
    assert not [f for f in b.frames_to_send() if parse_frame_header(f)[1] & TYPE_MASK == ERR]


def test_bad_ack_body_is_skipped_and_stray_ack_ignored() -> None:
    b = BlipConnection()
    (event,) = b.receive_message(frame_header(1, ACK_RPY) + b"\xff")
    assert isinstance(event, FrameIgnored) and "ACK" in event.reason
    assert b.receive_message(frame_header(9, ACK_MSG) + b"\x05") == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=6))
def test_no_input_raises_anything_but_protocol_error(frames: list[bytes]) -> None:
    conn = BlipConnection()
    conn.send_request({"Profile": "p"}, b"x" * 10)  # so that a reply #1 can be valid
    for frame in frames:
        try:
            conn.receive_message(frame)
        except ProtocolError:
            return


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(message_spec, min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    st.integers(0, 20),
)
def test_mutated_frames_raise_only_protocol_errors(
    specs: list[tuple[dict[str, str], bytes, bool, bool, bool]],
    mutations: list[tuple[int, int]],
    cut: int,
) -> None:
    a, b = BlipConnection(), BlipConnection()
    for props, body, urgent, compressed, no_reply in specs:
        a.send_request(props, body, urgent=urgent, compressed=compressed, no_reply=no_reply)
    frames = [bytearray(f) for f in a.frames_to_send(1 << 30)]
    for position, value in mutations:
        frame = frames[position % len(frames)]
        if frame:
            frame[position % len(frame)] = value
    if cut and frames[0]:
        del frames[0][-(cut % len(frames[0])) :]
    try:
        for frame in frames:
            b.receive_message(bytes(frame))
    except ProtocolError:
        assert b.state is ConnectionState.ERROR
