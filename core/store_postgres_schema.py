"""The PostgreSQL store's schema (``core.store_postgres``), as numbered migrations.

The schema is versioned by numbered migrations (:data:`MIGRATIONS`, the table
``wsnmom_schema``).  Every instance runs the missing ones at start inside one transaction
that holds a transaction-scoped advisory lock (:data:`MIGRATION_LOCK`), so when several
instances start together one migrates and the others wait for it, then find nothing left
to do (``PostgresConnections._migrate``).  A store whose version is newer than this wsnmom
is refused.
"""

from __future__ import annotations

#: the advisory-lock key migrations serialise on ("wsnm" as a number)
MIGRATION_LOCK = 0x77736E6D

#: numbered migrations: version -> statements; never edit one that was released, add one
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE subscriptions (
            id TEXT PRIMARY KEY, seq BIGSERIAL, termination_time TIMESTAMPTZ,
            data JSONB NOT NULL)""",
        """CREATE TABLE pull_points (
            id TEXT PRIMARY KEY, seq BIGSERIAL, name TEXT, termination_time TIMESTAMPTZ,
            data JSONB NOT NULL)""",
        "CREATE INDEX pull_points_name ON pull_points (name)",
        """CREATE TABLE registrations (
            id TEXT PRIMARY KEY, seq BIGSERIAL, termination_time TIMESTAMPTZ,
            data JSONB NOT NULL)""",
        """CREATE TABLE current_messages (
            namespace TEXT NOT NULL, path TEXT NOT NULL, data JSONB NOT NULL,
            PRIMARY KEY (namespace, path))""",
    ),
    2: ("CREATE TABLE wsnmom_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",),
    # the cluster (core.coordination_postgres): every write of a resource leaves a row in
    # the change log (origin: the writer's application_name, its instance id) and wakes
    # the other instances with NOTIFY; instances and shard leases with epochs
    3: (
        """CREATE TABLE wsnmom_changes (
            seq BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, id TEXT NOT NULL,
            origin TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())""",
        """CREATE FUNCTION wsnmom_note_change() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE rid TEXT;
        BEGIN
            IF TG_OP = 'DELETE' THEN rid := OLD.id; ELSE rid := NEW.id; END IF;
            INSERT INTO wsnmom_changes (kind, id, origin)
                VALUES (TG_ARGV[0], rid, current_setting('application_name'));
            PERFORM pg_notify('wsnmom_changes', TG_ARGV[0]);
            RETURN NULL;
        END $$""",
        """CREATE TRIGGER subscriptions_changed AFTER INSERT OR UPDATE OR DELETE
            ON subscriptions FOR EACH ROW EXECUTE FUNCTION wsnmom_note_change('subscription')""",
        """CREATE TRIGGER pull_points_changed AFTER INSERT OR UPDATE OR DELETE
            ON pull_points FOR EACH ROW EXECUTE FUNCTION wsnmom_note_change('pull_point')""",
        """CREATE TRIGGER registrations_changed AFTER INSERT OR UPDATE OR DELETE
            ON registrations FOR EACH ROW EXECUTE FUNCTION wsnmom_note_change('registration')""",
        """CREATE TABLE wsnmom_instances (
            id TEXT PRIMARY KEY, address TEXT NOT NULL, version TEXT NOT NULL,
            started_at TIMESTAMPTZ NOT NULL DEFAULT now(), heartbeat TIMESTAMPTZ NOT NULL)""",
        """CREATE TABLE wsnmom_shards (
            shard INTEGER PRIMARY KEY, owner TEXT, epoch BIGINT NOT NULL DEFAULT 0,
            expires_at TIMESTAMPTZ NOT NULL)""",
    ),
    # upstreams added at run time (``wsnmom upstream add``)
    4: ("CREATE TABLE upstreams (id TEXT PRIMARY KEY, seq BIGSERIAL, data JSONB NOT NULL)",),
    # every write of a subscription bumps its revision; an instance follows a stored
    # change only when its revision is higher than the one it holds (``core.follow``)
    5: ("ALTER TABLE subscriptions ADD COLUMN revision BIGINT NOT NULL DEFAULT 0",),
    # the nonce of every request one instance forwarded to another, kept while its
    # signature is valid: a replayed request is refused (``core.coordination_postgres``)
    6: (
        """CREATE TABLE wsnmom_nonces (
            nonce TEXT PRIMARY KEY, expires_at TIMESTAMPTZ NOT NULL)""",
        "CREATE INDEX wsnmom_nonces_expiry ON wsnmom_nonces (expires_at)",
    ),
    # the NOTIFY of a change names its writer (its instance id) instead of its kind: an
    # instance is not woken by its own writes (``PostgresCoordination.wait``)
    7: (
        """CREATE OR REPLACE FUNCTION wsnmom_note_change() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE rid TEXT; writer TEXT := current_setting('application_name');
        BEGIN
            IF TG_OP = 'DELETE' THEN rid := OLD.id; ELSE rid := NEW.id; END IF;
            INSERT INTO wsnmom_changes (kind, id, origin) VALUES (TG_ARGV[0], rid, writer);
            PERFORM pg_notify('wsnmom_changes', writer);
            RETURN NULL;
        END $$""",
    ),
    # intents: durable subscriptions being made before their record is written; the
    # record's write removes its intent in the same statement (``core.orphans``)
    8: (
        """CREATE TABLE wsnmom_intents (
            name TEXT PRIMARY KEY, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())""",
    ),
    # the leadership's epoch (its fencing token): bumped by each instance that takes the
    # leadership; the leader's writes of demand-based registrations are made only while
    # the epoch they were begun under is still this one (``core.coordination_postgres``)
    9: (
        """CREATE TABLE wsnmom_leadership (
            only_row BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
            epoch BIGINT NOT NULL, holder TEXT)""",
        "INSERT INTO wsnmom_leadership (only_row, epoch) VALUES (true, 0)",
    ),
    # the topic set a cluster shares: a topic an instance admitted first is recorded, and
    # its insert leaves a change (kind "topic", id its key) the others follow
    # (``core.topic_share``); a topic recorded already is not written again
    10: (
        """CREATE TABLE wsnmom_topics (
            id TEXT PRIMARY KEY, seq BIGSERIAL, namespace TEXT NOT NULL, path TEXT NOT NULL)""",
        """CREATE TRIGGER topics_changed AFTER INSERT ON wsnmom_topics
            FOR EACH ROW EXECUTE FUNCTION wsnmom_note_change('topic')""",
    ),
    # the delivery positions of durable subscriptions on a log-based middleware (Kafka),
    # per stream; written only while the writer's shard epoch is still the shard's
    # (``core.positions_postgres``)
    11: (
        """CREATE TABLE wsnmom_positions (
            name TEXT NOT NULL, stream TEXT NOT NULL, part INTEGER NOT NULL,
            position BIGINT NOT NULL, PRIMARY KEY (name, stream, part))""",
    ),
}
SCHEMA_VERSION = max(MIGRATIONS)
