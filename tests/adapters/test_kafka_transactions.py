"""What the session's Kafka-protocol broker (tansu locally) does with a zombie's
transactional offset commit (docs/scale-out.md, "Kafka" under "What fences what today"):
the experiment behind the transactional position fence the adapter could use instead of,
or on top of, the lease check before each position write.

Two transactional producers with one ``transactional.id`` (one per shard in that design)
stand for the old owner of a shard (``zombie``) and the new one (``owner``).  Positions go
to a member-less consumer group (as the adapter's ``wsnmom.sub.<id>`` groups) through
``send_offsets_to_transaction`` with the group metadata of a consumer that never
subscribed (generation -1, no member id).  Once the owner's ``init_transactions`` bumped
the epoch, neither the zombie's transaction open since before (its offsets sent, the
commit not yet) nor one it begins afterwards may move the group's offset.

Observed on tansu 0.6.0: offsets sent in a transaction are not visible before its commit
and an abort drops them; after the owner's ``init_transactions`` the zombie's
``TxnOffsetCommit`` is answered ``PRODUCER_FENCED`` (librdkafka: ``_FENCED``); its
``EndTxn`` for the transaction opened before is refused by closing the connection (the
broker logs ``ProducerFenced``), so librdkafka retries until the call times out
(``_TIMED_OUT``) and never says "fenced".  Apache Kafka answers both with an error.
"""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.kafka

#: the bound of every transactional call that should succeed (a loaded machine)
CALL = 30.0
#: how long the zombie's commit of its open transaction may try: tansu drops the
#: connection at each attempt, so the call takes all of it (a broker that took the commit
#: would answer in milliseconds)
ZOMBIE_COMMIT = 4.0
#: the errors a fenced producer's offset commit gets (librdkafka's, Kafka's)
FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


def group_metadata(bootstrap: str, group: str) -> object:
    """The opaque group metadata of a member-less ``group``: a consumer that never
    subscribes, closed once it is read (no join, no member)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()


def saved(admin: AdminClient, group: str, topic: str) -> int:
    """The group's offset of ``topic``'s partition 0 (-1001: none)."""
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])]
    result = admin.list_consumer_group_offsets(request, request_timeout=CALL)[group].result()
    return int(result.topic_partitions[0].offset)


def write(producer: Producer, metadata: object, topic: str, offset: int) -> None:
    """One transaction holding ``offset`` of ``topic``'s partition 0 for the group."""
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, offset)], metadata, CALL)
    producer.commit_transaction(CALL)


def test_a_zombies_transactional_offset_commits_are_fenced(kafka_bootstrap: str) -> None:
    bootstrap = kafka_bootstrap
    tag = uuid.uuid4().hex[:10]
    topic, group = f"wsnmom-txn-{tag}", f"wsnmom.sub.txn-{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(CALL)
    metadata = group_metadata(bootstrap, group)
    conf = {"bootstrap.servers": bootstrap, "transactional.id": f"wsnmom.shard.txn-{tag}.0"}
    zombie = Producer(conf)
    zombie.init_transactions(CALL)
    write(zombie, metadata, topic, 3)
    assert saved(admin, group, topic) == 3  # a member-less group takes it

    # offsets in a transaction land at its commit, never before, never after an abort
    zombie.begin_transaction()
    zombie.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], metadata, CALL)
    assert saved(admin, group, topic) == 3
    zombie.abort_transaction(CALL)
    assert saved(admin, group, topic) == 3

    # stopped between its offsets and its commit; the new owner initialises meanwhile
    zombie.begin_transaction()
    zombie.send_offsets_to_transaction([TopicPartition(topic, 0, 2)], metadata, CALL)
    owner = Producer(conf)
    owner.init_transactions(CALL)
    with pytest.raises(KafkaException):
        zombie.commit_transaction(ZOMBIE_COMMIT)
    assert saved(admin, group, topic) == 3

    # the owner writes ahead; then a third owner initialises, and a transaction the
    # (now stale) second one begins afterwards is refused at its offsets
    write(owner, metadata, topic, 7)
    assert saved(admin, group, topic) == 7
    third = Producer(conf)
    third.init_transactions(CALL)
    write(third, metadata, topic, 9)
    owner.begin_transaction()
    with pytest.raises(KafkaException) as refused:
        owner.send_offsets_to_transaction([TopicPartition(topic, 0, 1)], metadata, CALL)
        owner.commit_transaction(CALL)
    assert refused.value.args[0].code() in FENCED, refused.value
    assert saved(admin, group, topic) == 9
