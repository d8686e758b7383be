"""Tests of Magnetar's Pulsar door with the official Apache Pulsar Python
client. Run by tests/tests/pulsar_python.rs: `python client_tests.py URL
TEST TOPIC`, one test per process (the Rust side kills it after a timeout).
A test prints what it checked and exits 0, or raises (exit 1). Tests that
hand results to the Rust side print them as JSON lines prefixed `OUT `.
"""

import base64
import json
import sys
import time

import _pulsar
import pulsar
from pulsar import ConsumerType, InitialPosition, MessageId

RECEIVE_MS = 10_000


def client(url):
    return pulsar.Client(url, operation_timeout_seconds=20, connection_timeout_ms=10_000)


def expect_nothing(consumer, ms=500):
    try:
        m = consumer.receive(ms)
    except pulsar.Timeout:
        return
    raise AssertionError(f"unexpected message {m.data()!r} {m.message_id()}")


def test_round_trip(url, topic):
    """Messages with keys and properties go through unbatched, in order,
    with their fields; acknowledged ones are not delivered again."""
    c = client(url)
    p = c.create_producer(topic, batching_enabled=False)
    assert p.producer_name(), "no generated producer name"
    s = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    ids = []
    for i in range(20):
        ids.append(p.send(f"m{i}".encode(), properties={"i": str(i)}, partition_key=f"k{i % 3}",
                          event_timestamp=1000 + i))
    for i in range(20):
        m = s.receive(RECEIVE_MS)
        assert m.data() == f"m{i}".encode(), m.data()
        assert m.properties() == {"i": str(i)}, m.properties()
        assert m.partition_key() == f"k{i % 3}"
        assert m.event_timestamp() == 1000 + i
        assert m.publish_timestamp() > 0
        assert str(m.message_id()) == str(ids[i]), (m.message_id(), ids[i])
        assert m.redelivery_count() == 0
        s.acknowledge(m)
    s.close()
    s = c.subscribe(topic, "sub")
    expect_nothing(s)
    c.close()


def test_batching(url, topic):
    """A batching producer's messages arrive as individual messages with
    batch indexes; acknowledging all of them acknowledges the entries."""
    c = client(url)
    s = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    p = c.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                          batching_max_publish_delay_ms=50)
    n = 100
    for i in range(n):
        p.send_async(f"b{i}".encode(), None, properties={"i": str(i)})
    p.flush()
    batched = 0
    for i in range(n):
        m = s.receive(RECEIVE_MS)
        assert m.data() == f"b{i}".encode(), (i, m.data())
        assert m.properties() == {"i": str(i)}
        if m.message_id().batch_index() >= 0:
            batched += 1
        s.acknowledge(m)
    assert batched > 0, "no message came in a batch"
    s.close()
    s = c.subscribe(topic, "sub")
    expect_nothing(s)
    c.close()
    print(f"{batched} of {n} messages came in batches")


def test_exclusive(url, topic):
    c = client(url)
    s = c.subscribe(topic, "sub", consumer_type=ConsumerType.Exclusive)
    try:
        c.subscribe(topic, "sub", consumer_type=ConsumerType.Exclusive)
        raise AssertionError("a second exclusive consumer was accepted")
    except pulsar.ConsumerBusy:
        pass
    s.close()
    # Released: another may now subscribe.
    c.subscribe(topic, "sub", consumer_type=ConsumerType.Exclusive).close()
    c.close()


def test_shared(url, topic):
    """Two Shared consumers split the messages between them, each once."""
    c = client(url)
    a = c.subscribe(topic, "sub", consumer_type=ConsumerType.Shared, receiver_queue_size=5)
    b = c.subscribe(topic, "sub", consumer_type=ConsumerType.Shared, receiver_queue_size=5)
    p = c.create_producer(topic, batching_enabled=False)
    n = 40
    for i in range(n):
        p.send(f"s{i}".encode())
    got = {"a": [], "b": []}
    deadline = time.time() + 20
    while len(got["a"]) + len(got["b"]) < n and time.time() < deadline:
        for name, cons in (("a", a), ("b", b)):
            try:
                m = cons.receive(100)
            except pulsar.Timeout:
                continue
            got[name].append(m.data())
            cons.acknowledge(m)
    everything = sorted(got["a"] + got["b"])
    assert everything == sorted(f"s{i}".encode() for i in range(n)), everything
    assert got["a"] and got["b"], f"one consumer got nothing: {len(got['a'])}/{len(got['b'])}"
    c.close()


def test_failover(url, topic):
    """Failover: one active consumer gets everything; when it goes, the
    other takes over with the unacknowledged messages."""
    c = client(url)
    a = c.subscribe(topic, "sub", consumer_type=ConsumerType.Failover, consumer_name="a")
    b = c.subscribe(topic, "sub", consumer_type=ConsumerType.Failover, consumer_name="b")
    p = c.create_producer(topic, batching_enabled=False)
    for i in range(10):
        p.send(f"f{i}".encode())
    got = {}
    for name, cons in (("a", a), ("b", b)):
        got[name] = []
        while True:
            try:
                m = cons.receive(1000)
            except pulsar.Timeout:
                break
            got[name].append(m.data())
    active = "a" if got["a"] else "b"
    other = "b" if active == "a" else "a"
    assert len(got[active]) == 10 and not got[other], got
    (a if active == "a" else b).close()
    survivor = b if active == "a" else a
    again = []
    for _ in range(10):
        again.append(survivor.receive(RECEIVE_MS).data())
    assert again == got[active], again
    c.close()


def test_key_shared(url, topic):
    """Key_Shared: every key goes to one consumer only, and all arrive."""
    c = client(url)
    a = c.subscribe(topic, "sub", consumer_type=ConsumerType.KeyShared)
    b = c.subscribe(topic, "sub", consumer_type=ConsumerType.KeyShared)
    p = c.create_producer(topic, batching_enabled=False)
    n = 60
    for i in range(n):
        p.send(f"{i}".encode(), partition_key=f"key-{i % 12}")
    owner = {}
    count = 0
    deadline = time.time() + 20
    while count < n and time.time() < deadline:
        for name, cons in (("a", a), ("b", b)):
            try:
                m = cons.receive(100)
            except pulsar.Timeout:
                continue
            key = m.partition_key()
            assert owner.setdefault(key, name) == name, f"{key} went to both consumers"
            count += 1
            cons.acknowledge(m)
    assert count == n, count
    c.close()
    print(f"keys per consumer: {sorted(owner.items())}")


def murmur3_key_hash(key):
    """Pulsar's Key_Shared hash of a key: MurmurHash3 x86 32-bit, seed 0, of
    its UTF-8 bytes, sign bit cleared, modulo 65536."""
    data = key.encode()
    c1, c2, mask = 0xcc9e2d51, 0x1b873593, 0xffffffff

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & mask

    h = 0
    full = len(data) // 4 * 4
    for i in range(0, full, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = rotl((k * c1) & mask, 15) * c2 & mask
        h = (rotl(h ^ k, 13) * 5 + 0xe6546b64) & mask
    tail = data[full:]
    if tail:
        k = int.from_bytes(tail, "little")
        h ^= rotl((k * c1) & mask, 15) * c2 & mask
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85ebca6b) & mask
    h ^= h >> 13
    h = (h * 0xc2b2ae35) & mask
    h ^= h >> 16
    return (h & 0x7fffffff) % 65536


def receive_all(consumers, n, seconds=20):
    """Up to n messages from any of `consumers` (name -> consumer), acked:
    a list of (name, message)."""
    got = []
    deadline = time.time() + seconds
    while len(got) < n and time.time() < deadline:
        for name, cons in consumers.items():
            try:
                m = cons.receive(100)
            except pulsar.Timeout:
                continue
            got.append((name, m))
            cons.acknowledge(m)
    return got


def test_key_shared_sticky(url, topic):
    """Key_Shared sticky ranges: each message goes to the consumer whose
    inclusive range holds Murmur3(ordering key, else partition key) % 65536;
    an overlapping consumer is refused; messages of a range nobody owns wait
    until a consumer owning it attaches."""
    assert murmur3_key_hash("test") == 0x3a6bd213 % 65536  # the reference vector
    c = client(url)
    ranges = {"a": [(0, 20000)], "b": [(20001, 40000), (60001, 65535)], "c": [(40001, 60000)]}

    def sticky(name):
        policy = pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.Sticky,
                                                sticky_ranges=ranges[name])
        return c.subscribe(topic, "sub", consumer_type=ConsumerType.KeyShared, consumer_name=name,
                           key_shared_policy=policy)

    consumers = {"a": sticky("a"), "b": sticky("b")}
    try:
        overlapping = pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.Sticky,
                                                     sticky_ranges=[(19000, 21000)])
        c.subscribe(topic, "sub", consumer_type=ConsumerType.KeyShared, key_shared_policy=overlapping)
        raise AssertionError("a consumer overlapping others' sticky ranges was attached")
    except pulsar.ConsumerBusy:
        pass
    p = c.create_producer(topic, batching_enabled=False)
    sent = {}
    for i in range(120):
        # Every third message has an ordering key, which is hashed instead
        # of its partition key.
        if i % 3 == 0:
            p.send(f"{i}".encode(), partition_key=f"pk-{i % 7}", ordering_key=f"ok-{i % 11}")
            h = murmur3_key_hash(f"ok-{i % 11}")
        else:
            p.send(f"{i}".encode(), partition_key=f"key-{i % 40}")
            h = murmur3_key_hash(f"key-{i % 40}")
        sent[f"{i}".encode()] = next(n for n, rs in ranges.items() if any(s <= h <= e for s, e in rs))
    for_c = sum(1 for owner in sent.values() if owner == "c")
    assert 0 < for_c < len(sent), f"the keys should fall in every range: {sorted(sent.values())}"
    got = receive_all(consumers, len(sent) - for_c)
    expect_nothing(consumers["a"], 1000)
    expect_nothing(consumers["b"], 100)
    consumers["c"] = sticky("c")
    got += receive_all(consumers, for_c)
    assert len(got) == len(sent), f"{len(got)} of {len(sent)}"
    for name, m in got:
        assert sent[m.data()] == name, f"message {m.data()} went to {name}, its range is {sent[m.data()]}'s"
    print(f"per consumer: {[(n, sum(1 for x, _ in got if x == n)) for n in ranges]}")
    c.close()


def test_key_shared_auto_split(url, topic):
    """Key_Shared auto split with key-based batching: while the consumers
    stay the same every key goes to one consumer only; when one leaves its
    keys go to the others, and nothing is lost."""
    c = client(url)
    policy = pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.AutoSplit)
    consumers = {name: c.subscribe(topic, "sub", consumer_type=ConsumerType.KeyShared, consumer_name=name,
                                   key_shared_policy=policy)
                 for name in ("a", "b", "c")}
    p = c.create_producer(topic, batching_enabled=True, batching_type=pulsar.BatchingType.KeyBased,
                          batching_max_messages=10, batching_max_publish_delay_ms=20)

    def phase(start, n):
        for i in range(start, start + n):
            p.send_async(f"{i}".encode(), None, partition_key=f"key-{i % 30}")
        p.flush()
        got = receive_all(consumers, n)
        assert sorted(int(m.data()) for _, m in got) == list(range(start, start + n)), len(got)
        owner = {}
        for name, m in got:
            assert owner.setdefault(m.partition_key(), name) == name, f"{m.partition_key()} went to two consumers"
        return owner

    owner = phase(0, 300)
    assert set(owner.values()) == {"a", "b", "c"}, f"a consumer got no key: {owner}"
    consumers.pop("c").close()
    owner = phase(300, 300)
    assert set(owner.values()) <= {"a", "b"}
    c.close()


def test_non_persistent(url, topic):
    """Non-persistent topics: what is sent while a subscription has a
    consumer arrives, in order, with its fields, through every subscription
    type; what is sent before anyone subscribes is not kept; a partitioned
    non-persistent topic (TOPIC-parts, 3 partitions, made by the Rust side)
    spreads keyed messages over its partitions."""
    c = client(url)
    p = c.create_producer(topic, batching_enabled=False)
    p.send(b"nobody listens")
    # Exclusive.
    s = c.subscribe(topic, "ex", initial_position=InitialPosition.Earliest)
    for i in range(10):
        p.send(f"e{i}".encode(), partition_key=f"k{i}", properties={"i": str(i)})
    for i in range(10):
        m = s.receive(RECEIVE_MS)
        assert (m.data(), m.partition_key(), m.properties()) == (f"e{i}".encode(), f"k{i}", {"i": str(i)})
        s.acknowledge(m)
    try:
        c.subscribe(topic, "ex")
        raise AssertionError("a second consumer joined an exclusive subscription")
    except pulsar.ConsumerBusy:
        pass
    s.close()
    # Shared, Failover and Key_Shared: two consumers each.
    for sub_type in (ConsumerType.Shared, ConsumerType.Failover, ConsumerType.KeyShared):
        sub = f"sub-{sub_type}"
        consumers = {n: c.subscribe(topic, sub, consumer_type=sub_type, consumer_name=n) for n in ("a", "b")}
        time.sleep(0.5)  # the consumers' flow permits reach the broker
        for i in range(40):
            p.send(f"{i}".encode(), partition_key=f"key-{i % 8}")
        got = receive_all(consumers, 40)
        assert sorted(int(m.data()) for _, m in got) == list(range(40)), (sub_type, len(got))
        names = {n for n, _ in got}
        owner = {}
        for n, m in got:
            owner.setdefault(m.partition_key(), set()).add(n)
        if sub_type == ConsumerType.Failover:
            assert len(names) == 1, f"failover: both consumers got messages: {names}"
        elif sub_type == ConsumerType.KeyShared:
            assert all(len(v) == 1 for v in owner.values()), f"key_shared: a key went to both: {owner}"
        else:
            assert names == {"a", "b"}, f"shared: one consumer got everything: {names}"
        for cons in consumers.values():
            cons.close()
    # Partitioned.
    parts = topic + "-parts"
    assert len(c.get_topic_partitions(parts)) == 3, c.get_topic_partitions(parts)
    s = c.subscribe(parts, "sub")
    pp = c.create_producer(parts, batching_enabled=False)
    partitions = set()
    time.sleep(0.5)
    for i in range(30):
        partitions.add(pp.send(f"{i}".encode(), partition_key=f"key-{i}").partition())
    assert partitions == {0, 1, 2}, partitions
    got = set()
    for _ in range(30):
        m = s.receive(RECEIVE_MS)
        assert m.topic_name().startswith(parts + "-partition-"), m.topic_name()
        got.add(m.data())
        s.acknowledge(m)
    assert got == {f"{i}".encode() for i in range(30)}
    c.close()


def test_acks(url, topic):
    """Individual and cumulative acks: after a cumulative ack of message 5
    and an individual ack of 8, a new consumer gets 6, 7, 9."""
    c = client(url)
    s = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    p = c.create_producer(topic, batching_enabled=False)
    for i in range(10):
        p.send(f"{i}".encode())
    msgs = [s.receive(RECEIVE_MS) for _ in range(10)]
    s.acknowledge_cumulative(msgs[5])
    s.acknowledge(msgs[8])
    s.close()
    time.sleep(0.2)
    s = c.subscribe(topic, "sub")
    got = [s.receive(RECEIVE_MS).data() for _ in range(3)]
    assert got == [b"6", b"7", b"9"], got
    expect_nothing(s)
    c.close()


def test_negative_ack(url, topic):
    """A negatively acknowledged message comes back with redelivery count 1,
    then 2."""
    c = client(url)
    s = c.subscribe(topic, "sub", consumer_type=ConsumerType.Shared, negative_ack_redelivery_delay_ms=100)
    p = c.create_producer(topic, batching_enabled=False)
    p.send(b"nack-me")
    for count in range(3):
        m = s.receive(RECEIVE_MS)
        assert m.data() == b"nack-me"
        assert m.redelivery_count() == count, (m.redelivery_count(), count)
        if count < 2:
            s.negative_acknowledge(m)
        else:
            s.acknowledge(m)
    expect_nothing(s)
    c.close()


def test_seek(url, topic):
    """Seek by message id and by publish time rewinds the subscription."""
    c = client(url)
    s = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    p = c.create_producer(topic, batching_enabled=False)
    ids = [p.send(f"{i}".encode()) for i in range(10)]
    for _ in range(10):
        s.acknowledge(s.receive(RECEIVE_MS))
    s.seek(ids[3])
    # The broker delivers from message 3; the C++ client drops the seek
    # position itself (its start id is not inclusive), as with Pulsar.
    got = [s.receive(RECEIVE_MS).data() for _ in range(6)]
    assert got == [f"{i}".encode() for i in range(4, 10)], got
    expect_nothing(s)
    s.close()
    t = c.subscribe(topic, "by-time", initial_position=InitialPosition.Earliest)
    for _ in range(10):
        t.acknowledge(t.receive(RECEIVE_MS))
    t.seek(0)  # publish time 0: everything again
    got = [t.receive(RECEIVE_MS).data() for _ in range(10)]
    assert got == [f"{i}".encode() for i in range(10)], got
    c.close()


def test_reader(url, topic):
    """Readers from the earliest message and from an id;
    has_message_available and get_last_message_id."""
    c = client(url)
    p = c.create_producer(topic, batching_enabled=False)
    ids = [p.send(f"{i}".encode()) for i in range(5)]
    r = c.create_reader(topic, MessageId.earliest)
    got = []
    while r.has_message_available():
        got.append(r.read_next(RECEIVE_MS).data())
    assert got == [f"{i}".encode() for i in range(5)], got
    r.close()
    r = c.create_reader(topic, ids[1])
    # Not inclusive: the first read is the message after the start id.
    assert r.read_next(RECEIVE_MS).data() == b"2"
    r.close()
    r = c.create_reader(topic, ids[1], start_message_id_inclusive=True)
    assert r.read_next(RECEIVE_MS).data() == b"1"
    r.close()
    s = c.subscribe(topic, "last")
    last = s.get_last_message_id()
    assert (last.ledger_id(), last.entry_id()) == (ids[4].ledger_id(), ids[4].entry_id()), (last, ids[4])
    c.close()


def test_empty_topic_last_id(url, topic):
    c = client(url)
    r = c.create_reader(topic, MessageId.earliest)
    assert not r.has_message_available()
    c.close()


def test_last_id_in_batch(url, topic):
    """GET_LAST_MESSAGE_ID names the last message of a batch (its batch
    index), so a reader part-way through the last batch still has messages
    available, and has none once it read them all."""
    c = client(url)
    p = c.create_producer(topic, batching_enabled=True, batching_max_messages=5,
                          batching_max_publish_delay_ms=10_000)
    for i in range(5):
        p.send_async(f"m{i}".encode(), None)
    p.flush()
    r = c.create_reader(topic, MessageId.earliest)
    for i in range(5):
        assert r.has_message_available(), f"nothing available after {i} of the batch's 5 messages"
        m = r.read_next(RECEIVE_MS)
        assert m.data() == f"m{i}".encode(), m.data()
        assert m.message_id().batch_index() == i, m.message_id()
    assert not r.has_message_available(), "messages available past the batch's last one"
    print("last id in a batch: has_message_available true through the batch, false after it")
    c.close()


def test_ack_timeout(url, topic):
    """Messages received and not acknowledged within the ack timeout (the C++
    client's minimum, 10 s) come again, with redelivery count 1; acked ones
    do not."""
    c = client(url)
    s = c.subscribe(topic, "sub", consumer_type=ConsumerType.Shared, unacked_messages_timeout_ms=10_000,
                    initial_position=InitialPosition.Earliest)
    p = c.create_producer(topic, batching_enabled=False)
    for i in range(4):
        p.send(f"m{i}".encode())
    first = [s.receive(RECEIVE_MS) for _ in range(4)]
    assert [m.data() for m in first] == [b"m0", b"m1", b"m2", b"m3"], [m.data() for m in first]
    s.acknowledge(first[0])
    s.acknowledge(first[2])
    again = sorted((s.receive(30_000) for _ in range(2)), key=lambda m: m.data())
    assert [m.data() for m in again] == [b"m1", b"m3"], [m.data() for m in again]
    assert [m.redelivery_count() for m in again] == [1, 1], [m.redelivery_count() for m in again]
    for m in again:
        s.acknowledge(m)
    expect_nothing(s, 12_000)
    print("ack timeout: the two unacked messages came again with redelivery count 1")
    c.close()


def test_unsubscribe(url, topic):
    """UNSUBSCRIBE deletes the subscription (its cursor with it), and is
    refused while another consumer is attached."""
    c = client(url)
    p = c.create_producer(topic, batching_enabled=False)
    s = c.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
    other = c.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
    try:
        s.unsubscribe()
        raise AssertionError("unsubscribed while another consumer was attached")
    except pulsar.PulsarException:
        pass
    other.close()
    s.unsubscribe()
    p.send(b"while gone")
    # Subscribed again at the latest position: had the old cursor been kept,
    # "while gone" would be its backlog.
    s = c.subscribe(topic, "sub", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Latest)
    p.send(b"after")
    assert s.receive(RECEIVE_MS).data() == b"after"
    expect_nothing(s)
    print("unsubscribe: refused beside another consumer, then the subscription was gone")
    c.close()


def test_partitioned(url, topic):
    """A partitioned topic (3 partitions, made by the Rust side): keyed
    messages are spread over the partitions, each partition's id names it,
    and one consumer gets them all."""
    c = client(url)
    assert len(c.get_topic_partitions(topic)) == 3, c.get_topic_partitions(topic)
    s = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    p = c.create_producer(topic, batching_enabled=False)
    partitions = set()
    for i in range(30):
        mid = p.send(f"{i}".encode(), partition_key=f"key-{i}")
        partitions.add(mid.partition())
    assert partitions == {0, 1, 2}, partitions
    got = set()
    for _ in range(30):
        m = s.receive(RECEIVE_MS)
        assert m.message_id().partition() in (0, 1, 2)
        assert m.topic_name().startswith(topic + "-partition-"), m.topic_name()
        got.add(m.data())
        s.acknowledge(m)
    assert got == {f"{i}".encode() for i in range(30)}
    c.close()


def test_regex(url, topic):
    """A regex subscription takes the namespace's matching topics that exist
    when it subscribes (not the others), and a matching topic created later
    once the client's discovery (every second here) runs. `TOPIC-parts` is
    a partitioned topic (2 partitions, made by the Rust side): the pattern
    takes it whole."""
    c = client(url)
    first = c.create_producer(topic + "-a", batching_enabled=False)
    parts = c.create_producer(topic + "-parts", batching_enabled=False)
    other = c.create_producer(topic + "x-b", batching_enabled=False)
    # The wheel's `subscribe(pattern_auto_discovery_period=...)` never sets
    # the period (apache/pulsar-client-python#171: always 60 s), so the
    # consumer is made with the binding's configuration directly.
    conf = _pulsar.ConsumerConfiguration()
    conf.consumer_type(ConsumerType.Shared)
    conf.subscription_initial_position(InitialPosition.Earliest)
    conf.pattern_auto_discovery_period(1)
    conf.schema(pulsar.schema.BytesSchema().schema_info())
    s = pulsar.Consumer()
    s._consumer = c._client.subscribe_pattern(topic + "-.*", "sub", conf)
    s._client = c
    s._schema = pulsar.schema.BytesSchema()
    first.send(b"a0")
    for i in range(4):
        parts.send(f"p{i}".encode(), partition_key=f"k{i}")
    other.send(b"not matched")
    got = {}
    for _ in range(5):
        m = s.receive(RECEIVE_MS)
        got[m.data()] = m.topic_name()
        s.acknowledge(m)
    assert got[b"a0"] == topic + "-a", got
    assert sorted(got) == [b"a0", b"p0", b"p1", b"p2", b"p3"], got
    assert all(got[f"p{i}".encode()].startswith(topic + "-parts-partition-") for i in range(4)), got
    # Created after the subscription: a plain topic and a partitioned one
    # (auto-created with partitions by the Rust side's namespace policy).
    later = c.create_producer(topic + "-later", batching_enabled=False)
    later.send(b"later0")
    start = time.time()
    got = {}
    while len(got) < 1 and time.time() - start < 30:
        try:
            m = s.receive(1000)
        except pulsar.Timeout:
            continue
        got[m.data()] = m.topic_name()
        s.acknowledge(m)
    assert got == {b"later0": topic + "-later"}, f"not discovered within 30 s: {got}"
    print(f"discovered a later topic in {time.time() - start:.1f} s")
    expect_nothing(s, 1500)
    c.close()


def test_cross_consume(url, topic):
    """Hands what it receives to the Rust side (native produce → Pulsar
    consume): count from argv[4]."""
    n = int(sys.argv[4])
    c = client(url)
    s = c.subscribe(topic, "cross", initial_position=InitialPosition.Earliest)
    for _ in range(n):
        m = s.receive(RECEIVE_MS)
        print("OUT " + json.dumps({
            "payload": base64.b64encode(m.data()).decode(),
            "key": m.partition_key() or None,
            "properties": m.properties(),
            "event_time": m.event_timestamp(),
            "redelivery_count": m.redelivery_count(),
            "id": [m.message_id().ledger_id(), m.message_id().entry_id(), m.message_id().batch_index()],
        }))
        s.acknowledge(m)
    c.close()


def test_cross_produce(url, topic):
    """Produces for the Rust side to consume natively: 5 unbatched messages
    then 5 in one batch, with binary payloads, keys and properties."""
    c = client(url)
    p = c.create_producer(topic, batching_enabled=False)
    for i in range(5):
        p.send(bytes([0, 255, i]) + b"single", partition_key=f"k{i}", properties={"n": str(i)})
    p.close()
    p = c.create_producer(topic, batching_enabled=True, batching_max_messages=5,
                          batching_max_publish_delay_ms=1000)
    for i in range(5):
        p.send_async(bytes([1, 254, i]) + b"batched", None, partition_key=f"b{i}", properties={"n": str(i)})
    p.flush()
    c.close()


def test_find_produce(url, topic):
    """Produces for an admin lookup by key: one unbatched message with key
    k1, then key-based batches of keys k0..k2 (6 messages each), every
    message with properties naming it."""
    c = client(url)
    p = c.create_producer(topic, batching_enabled=False)
    p.send(b"single-k1", partition_key="k1", properties={"n": "single", "key": "k1"})
    p.close()
    p = c.create_producer(topic, batching_enabled=True, batching_type=pulsar.BatchingType.KeyBased,
                          batching_max_messages=18, batching_max_publish_delay_ms=1000)
    for i in range(18):
        key = f"k{i % 3}"
        p.send_async(f"batched-{i}".encode(), None, partition_key=key, properties={"n": str(i), "key": key})
    p.flush()
    c.close()


def test_cross_produce_compressed(url, topic):
    """Produces for the Rust side to consume natively, with each codec: a
    batch of 4 messages (binary payloads that compress, keys, properties)
    and one unbatched message, in that order."""
    c = client(url)
    codecs = [pulsar.CompressionType.LZ4, pulsar.CompressionType.ZLib, pulsar.CompressionType.ZSTD,
              pulsar.CompressionType.SNAPPY]
    for n, codec in enumerate(codecs):
        p = c.create_producer(topic, compression_type=codec, batching_enabled=True, batching_max_messages=4,
                              batching_max_publish_delay_ms=1000)
        for i in range(4):
            p.send_async(bytes([n, i, 0, 255]) * 100, None, partition_key=f"c{n}-{i}",
                         properties={"codec": str(n), "i": str(i)})
        p.flush()
        p.close()
        p = c.create_producer(topic, compression_type=codec, batching_enabled=False)
        p.send(bytes([n, 9, 0, 255]) * 100, partition_key=f"c{n}-single", properties={"codec": str(n)})
        p.close()
    c.close()


def test_still_works(url, topic):
    """After bad input on other connections: produce and consume still work."""
    c = client(url)
    s = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    p = c.create_producer(topic, batching_enabled=False)
    p.send(b"alive")
    assert s.receive(RECEIVE_MS).data() == b"alive"
    c.close()


def test_too_big(url, topic):
    """A message over the broker's max_message_size (announced in CONNECTED)
    fails in the client with MessageTooBig, unless chunked."""
    c = client(url)
    p = c.create_producer(topic, batching_enabled=False)
    try:
        p.send(b"x" * (6 * 1024 * 1024))
        raise AssertionError("an over-size message was sent")
    except pulsar.MessageTooBig:
        pass
    c.close()


def test_compression(url, topic):
    """Every codec, batched and not: the broker stores and serves the
    compressed bytes as sent; the consumer decompresses."""
    c = client(url)
    s = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    codecs = [pulsar.CompressionType.LZ4, pulsar.CompressionType.ZLib, pulsar.CompressionType.ZSTD,
              pulsar.CompressionType.SNAPPY]
    expected = []
    for codec in codecs:
        for batching in (False, True):
            p = c.create_producer(topic, compression_type=codec, batching_enabled=batching,
                                  batching_max_messages=5, batching_max_publish_delay_ms=1000)
            for i in range(5):
                data = f"{codec}-{batching}-{i}-".encode() * 50
                expected.append(data)
                p.send_async(data, None)
            p.flush()
            p.close()
    got = [s.receive(RECEIVE_MS).data() for _ in expected]
    assert got == expected
    c.close()


def test_chunking(url, topic):
    """A message over the broker's max message size goes in chunks when the
    producer chunks, and arrives whole."""
    c = client(url)
    s = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    p = c.create_producer(topic, batching_enabled=False, chunking_enabled=True)
    big = bytes(range(256)) * (7 * 1024 * 1024 // 256)
    p.send(big)
    p.send(b"after")
    m = s.receive(RECEIVE_MS * 3)
    assert m.data() == big, len(m.data())
    s.acknowledge(m)
    assert s.receive(RECEIVE_MS).data() == b"after"
    c.close()


def test_delayed_delivery(url, topic):
    """deliver_after on a Shared subscription: the message waits."""
    c = client(url)
    s = c.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
    p = c.create_producer(topic, batching_enabled=False)
    start = time.time()
    p.send(b"later", deliver_after=__import__("datetime").timedelta(seconds=2))
    p.send(b"now")
    assert s.receive(RECEIVE_MS).data() == b"now"
    m = s.receive(RECEIVE_MS)
    assert m.data() == b"later"
    assert time.time() - start >= 1.9, time.time() - start
    c.close()


def test_dead_letter(url, topic):
    """The client's dead-letter policy: after max redeliveries the message
    goes to the DLQ topic (auto-created) and a consumer of it gets it."""
    c = client(url)
    dlq = topic + "-DLQ"
    d = c.subscribe(dlq, "dlq-sub", initial_position=InitialPosition.Earliest)
    s = c.subscribe(topic, "sub", consumer_type=ConsumerType.Shared, negative_ack_redelivery_delay_ms=100,
                    dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2,
                                                                       dead_letter_topic=dlq))
    p = c.create_producer(topic, batching_enabled=False)
    p.send(b"poison", properties={"x": "y"})
    for _ in range(3):
        m = s.receive(RECEIVE_MS)
        assert m.data() == b"poison"
        s.negative_acknowledge(m)
    m = d.receive(RECEIVE_MS * 2)
    assert m.data() == b"poison", m.data()
    assert m.properties().get("x") == "y", m.properties()
    expect_nothing(s, 1000)
    c.close()


def test_batch_index_ack(url, topic):
    """With batch-index acks, acknowledging some messages of a batch and
    reconnecting redelivers only the others."""
    c = client(url)
    s = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest, batch_index_ack_enabled=True)
    p = c.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                          batching_max_publish_delay_ms=1000)
    for i in range(10):
        p.send_async(f"{i}".encode(), None)
    p.flush()
    msgs = [s.receive(RECEIVE_MS) for _ in range(10)]
    assert all(m.message_id().batch_index() >= 0 for m in msgs)
    for m in msgs[::2]:
        s.acknowledge(m)
    time.sleep(0.5)
    s.close()
    s = c.subscribe(topic, "sub", batch_index_ack_enabled=True)
    got = []
    while True:
        try:
            m = s.receive(1000)
        except pulsar.Timeout:
            break
        got.append(m.data())
    assert got == [f"{i}".encode() for i in range(1, 10, 2)], got
    c.close()


def test_dedup(url, topic):
    """A named producer learns its last sequence id on reconnecting; a
    resend of a stored sequence id is answered, not stored again (the
    namespace has deduplication on: set by the Rust side)."""
    c = client(url)
    p = c.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    for i in range(3):
        p.send(f"{i}".encode(), sequence_id=i)
    p.close()
    p = c.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    assert p.last_sequence_id() == 2, p.last_sequence_id()
    p.send(b"dup", sequence_id=1)
    p.send(b"3", sequence_id=3)
    s = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    got = [s.receive(RECEIVE_MS).data() for _ in range(4)]
    assert got == [b"0", b"1", b"2", b"3"], got
    expect_nothing(s)
    c.close()


def test_connection_loss(url, topic):
    """A client process killed with SIGKILL: its exclusive subscription is
    released and its unacknowledged message is delivered again."""
    import subprocess
    import signal
    c = client(url)
    p = c.create_producer(topic, batching_enabled=False)
    p.send(b"unacked")
    child = subprocess.Popen([sys.executable, __file__, url, "hold_unacked", topic],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        # The client logs to stdout too: wait for the helper's own line.
        while True:
            line = child.stdout.readline()
            assert line, "the helper ended before holding its message"
            if line.strip() == "holding":
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.time() + 20
    while True:
        try:
            s = c.subscribe(topic, "sub", consumer_type=ConsumerType.Exclusive)
            break
        except pulsar.ConsumerBusy:
            assert time.time() < deadline, "the dead client's exclusive consumer was never released"
            time.sleep(0.2)
    m = s.receive(RECEIVE_MS)
    assert m.data() == b"unacked"
    c.close()


def test_access_modes(url, topic):
    """Producer access modes: Exclusive refuses any second producer;
    WaitForExclusive waits (the broker answers `producer_ready = false` at
    once: the Rust side checks the client logged it) and takes over when the
    holder closes; ExclusiveWithFencing takes the topic from the holder, whose
    later sends are not stored. (The C++ client gives up a producer's start
    after its operation timeout even while queued, so the wait stays below
    it.)"""
    import threading
    from pulsar import ProducerAccessMode
    c = client(url)
    a = c.create_producer(topic, producer_name="a", access_mode=ProducerAccessMode.Exclusive,
                          batching_enabled=False)
    for name, mode in [("x", ProducerAccessMode.Exclusive), ("y", ProducerAccessMode.Shared)]:
        try:
            c.create_producer(topic, producer_name=name, access_mode=mode)
            raise AssertionError(f"producer {name} ({mode}) was accepted beside an exclusive one")
        except pulsar.ProducerBusy:
            pass
    got = {}

    def wait():
        try:
            got["w"] = c.create_producer(topic, producer_name="w", access_mode=ProducerAccessMode.WaitForExclusive,
                                         batching_enabled=False, send_timeout_millis=3000)
        except Exception as e:  # reported by the main thread
            got["error"] = e

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(3)
    assert t.is_alive() and not got, f"WaitForExclusive did not keep waiting: {got}"
    a.send(b"from-a")
    a.close()
    t.join(20)
    assert "w" in got, f"WaitForExclusive never took over: {got}"
    w = got["w"]
    w.send(b"from-w")
    f = c.create_producer(topic, producer_name="f", access_mode=ProducerAccessMode.ExclusiveWithFencing,
                          batching_enabled=False)
    f.send(b"from-f")
    try:
        w.send(b"fenced")
        raise AssertionError("a fenced producer's send got a receipt")
    except pulsar.PulsarException:
        pass
    r = c.create_reader(topic, MessageId.earliest)
    seen = []
    while r.has_message_available():
        seen.append(r.read_next(RECEIVE_MS).data())
    assert seen == [b"from-a", b"from-w", b"from-f"], seen
    print("access modes: exclusive refusals, a wait past the operation timeout, fencing", seen)
    c.close()


def test_produce_until_killed(url, topic):
    """Helper of pulsar_kill9_during_produce: sends numbered messages
    (batched, async) until killed, printing `OUT ACK n` for each receipt."""
    import threading
    lock = threading.Lock()
    c = client(url)
    p = c.create_producer(topic, batching_enabled=True, batching_max_messages=50,
                          batching_max_publish_delay_ms=2, max_pending_messages=2000,
                          block_if_queue_full=True, send_timeout_millis=0)

    def receipt(n):
        def done(res, _msg_id):
            if res == pulsar.Result.Ok:
                with lock:
                    print(f"OUT ACK {n}", flush=True)
        return done

    n = 0
    while True:
        p.send_async(f"{n}".encode(), receipt(n))
        n += 1


def test_hold_unacked(url, topic):
    """Helper of connection_loss: receives one message without acking it and
    waits to be killed."""
    c = client(url)
    s = c.subscribe(topic, "sub", consumer_type=ConsumerType.Exclusive, initial_position=InitialPosition.Earliest)
    s.receive(RECEIVE_MS)
    print("holding", flush=True)
    time.sleep(600)


def test_auth_matrix(url, topic):
    """The Pulsar door's cells of the security matrix (tests/tests/security.rs):
    argv[4] is a JSON file {"roles": {ROLE: {"token": TOKEN or null,
    "timeout": SECONDS}}, "cells": [{"id", "role", "op", "topic"}]}. Each
    cell runs with its role's client; its result, "ok" or the exception's
    class name, goes into the JSON object {ID: RESULT} written to argv[4]
    + ".results" (not stdout, where the C++ client logs too). `topic` is
    unused."""
    with open(sys.argv[4]) as f:
        spec = json.load(f)
    clients = {}
    results = {}
    for name, role in spec["roles"].items():
        auth = pulsar.AuthenticationToken(role["token"]) if role["token"] else None
        clients[name] = pulsar.Client(url, authentication=auth, operation_timeout_seconds=role["timeout"],
                                      connection_timeout_ms=10_000)
    for cell in spec["cells"]:
        c = clients[cell["role"]]
        try:
            if cell["op"] == "produce":
                p = c.create_producer(cell["topic"], batching_enabled=False)
                p.send(f"cell {cell['id']}".encode())
                p.close()
            elif cell["op"] == "consume":
                s = c.subscribe(cell["topic"], f"sub-{cell['id']}")
                s.close()
            elif cell["op"] == "partitioned_metadata":
                c.get_topic_partitions(cell["topic"])
            else:
                raise AssertionError(f"unknown op {cell['op']}")
            result = "ok"
        except AssertionError:
            raise
        except Exception as e:  # the class name is the answer
            result = type(e).__name__
        results[cell["id"]] = result
    for c in clients.values():
        c.close()
    with open(sys.argv[4] + ".results", "w") as f:
        json.dump(results, f)


def test_tls(url, topic):
    """Over TLS (url is pulsar+ssl://, argv[4] the CA to trust): messages
    go through; a plain-text client (argv[5], the same port as pulsar://)
    gets an error, not messages, and the broker keeps serving."""
    c = pulsar.Client(url, tls_trust_certs_file_path=sys.argv[4], operation_timeout_seconds=20,
                      connection_timeout_ms=10_000)
    s = c.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    p = c.create_producer(topic, batching_enabled=False)
    for i in range(10):
        p.send(f"tls {i}".encode())
    for i in range(10):
        m = s.receive(RECEIVE_MS)
        assert m.data() == f"tls {i}".encode(), m.data()
        s.acknowledge(m)
    plain = pulsar.Client(sys.argv[5], operation_timeout_seconds=3, connection_timeout_ms=3_000)
    try:
        plain.create_producer(topic)
        raise AssertionError("a plain-text client got a producer on the TLS port")
    except (pulsar.Timeout, pulsar.ConnectError) as e:
        print(f"plain-text client on the TLS port: {type(e).__name__}")
    plain.close()
    p.send(b"after the plain client")
    assert s.receive(RECEIVE_MS).data() == b"after the plain client"
    c.close()


def test_auth_refresh(url, topic):
    """AUTH_CHALLENGE (argv[4]: a JSON file {"short": TOKEN, "fresh":
    TOKEN, "short_exp": SECONDS}): client A's token supplier gives a token
    that expires soon, then fresh ones; client B's only ever the short one.
    After the short token's expiry the broker challenges both: A answers
    with a fresh token and keeps producing on its connection; B's stale
    answer is refused and it cannot produce any more."""
    with open(sys.argv[4]) as f:
        spec = json.load(f)
    calls = []

    def supplier_a():
        calls.append(time.time())
        return spec["short"] if len(calls) == 1 else spec["fresh"]

    a = pulsar.Client(url, authentication=pulsar.AuthenticationToken(supplier_a), operation_timeout_seconds=20)
    b = pulsar.Client(url, authentication=pulsar.AuthenticationToken(lambda: spec["short"]),
                      operation_timeout_seconds=5)
    pa = a.create_producer(topic, batching_enabled=False)
    pb = b.create_producer(topic, batching_enabled=False, send_timeout_millis=5000)
    pa.send(b"a before")
    pb.send(b"b before")
    # Past the short token's expiry, and the broker's challenge.
    time.sleep(max(0, spec["short_exp"] - time.time()) + 4)
    pa.send(b"a after")
    assert len(calls) >= 2, f"the broker never asked for fresh credentials ({len(calls)} supplier calls)"
    try:
        pb.send(b"b after")
        raise AssertionError("a client whose token expired kept producing")
    except (pulsar.Timeout, pulsar.AuthenticationError, pulsar.ConnectError) as e:
        print(f"stale client: {type(e).__name__}")
    a.close()
    b.close()


TESTS = {name[len("test_"):]: f for name, f in globals().items() if name.startswith("test_")}

if __name__ == "__main__":
    url, name, topic = sys.argv[1], sys.argv[2], sys.argv[3]
    TESTS[name](url, topic)
    print(f"PASSED {name}")
