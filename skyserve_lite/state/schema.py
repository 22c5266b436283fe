"""The schema: numbered migrations, one definition for both engines. Migration N moves the schema version
(SQLite's ``PRAGMA user_version``, PostgreSQL's ``schema_version`` row) from N-1 to N.

A migration is a tuple of steps: SQL both engines run, with its column types written as placeholders
(``{TEXT}``, ``{INTEGER}``, ``{REAL}``, ``{BLOB}``, ``{SERIAL_KEY}``: ``state.dialect`` renders them, e.g. ``REAL`` for
SQLite and ``DOUBLE PRECISION`` for PostgreSQL, whose ``REAL`` is a 4-byte float), and ``CountingTriggers``,
which each engine writes in its own trigger language. Upserts are ``INSERT ... ON CONFLICT``, which both know.

Never edit a migration that has shipped (what it renders for SQLite must stay what it was); append a new one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CountingTriggers:
    """Triggers ``<table>_inserted``, ``_updated`` and ``_deleted`` on each of ``tables``, adding one to the
    ``meta`` row ``counter`` for every row written, whichever process writes it."""

    counter: str
    tables: tuple[str, ...]


@dataclass(frozen=True)
class ServiceCountingTriggers:
    """A counter per service, whichever process writes: triggers ``<table>_changed_inserted``, ``_updated``
    and ``_deleted`` on the table of services and on each (table, column) of ``tables``, adding one to the
    row of ``counter_table`` (``service``, ``generation``) of the service the written row is (its ``name``)
    or names (in ``column``), so that a reader keeping what it derived from one service's rows knows when
    to derive it again. A service's insert creates its counter row; a row of ``tables`` only moves it (each
    names an existing service: a foreign key)."""

    counter_table: str
    tables: tuple[tuple[str, str], ...]
    # The services table's own triggers too: once, with the counter table; False for tables counted later.
    services: bool = True


Step = str | CountingTriggers | ServiceCountingTriggers

MIGRATIONS: tuple[tuple[Step, ...], ...] = (
    # 1: services, versions, replicas, events, request counts, and controller metadata.
    ("""
    CREATE TABLE meta (
        key {TEXT} PRIMARY KEY,
        value {TEXT} NOT NULL
    );
    CREATE TABLE services (
        name {TEXT} PRIMARY KEY,
        current_version {INTEGER} NOT NULL,
        status {TEXT} NOT NULL,
        status_reason {TEXT},
        lb_port {INTEGER} NOT NULL UNIQUE,
        lb_pid {INTEGER},
        lb_policy {TEXT} NOT NULL,
        deleting {INTEGER} NOT NULL DEFAULT 0,
        created_at {REAL} NOT NULL,
        next_replica_id {INTEGER} NOT NULL DEFAULT 1
    );
    CREATE TABLE versions (
        service {TEXT} NOT NULL REFERENCES services(name) ON DELETE CASCADE,
        version {INTEGER} NOT NULL,
        text {TEXT} NOT NULL,
        source {TEXT} NOT NULL,
        spec_json {TEXT} NOT NULL,
        mode {TEXT} NOT NULL,
        created_at {REAL} NOT NULL,
        PRIMARY KEY (service, version)
    );
    CREATE TABLE replicas (
        service {TEXT} NOT NULL REFERENCES services(name) ON DELETE CASCADE,
        replica_id {INTEGER} NOT NULL,
        version {INTEGER} NOT NULL,
        status {TEXT} NOT NULL,
        cloud {TEXT} NOT NULL,
        launched_at {REAL} NOT NULL,
        status_since {REAL} NOT NULL,
        launch_token {TEXT} NOT NULL,
        is_spot {INTEGER} NOT NULL,
        region {TEXT},
        zone {TEXT},
        instance_id {TEXT},
        url {TEXT},
        first_ready_at {REAL},
        probe_failing_since {REAL},
        status_reason {TEXT},
        PRIMARY KEY (service, replica_id)
    );
    CREATE TABLE events (
        event_id {SERIAL_KEY},
        time {REAL} NOT NULL,
        service {TEXT} NOT NULL,
        replica_id {INTEGER},
        kind {TEXT} NOT NULL,
        message {TEXT} NOT NULL
    );
    CREATE INDEX events_by_service ON events (service, event_id);
    CREATE TABLE request_counts (
        service {TEXT} NOT NULL,
        second {INTEGER} NOT NULL,
        count {INTEGER} NOT NULL,
        PRIMARY KEY (service, second)
    );
    """,),
    # 2: updates. Which versions get traffic during a rollout (JSON list; NULL: every READY replica),
    #    and a note per version (e.g. "rollback to version 1").
    ("""
    ALTER TABLE services ADD COLUMN active_versions {TEXT};
    ALTER TABLE versions ADD COLUMN note {TEXT};
    """,),
    # 3: autoscaling. The policy's state (target and hysteresis counters) with what it last observed, and
    #    each load balancer's latest report: in-flight requests per replica url, requests held waiting.
    ("""
    CREATE TABLE autoscaler_state (
        service {TEXT} PRIMARY KEY REFERENCES services(name) ON DELETE CASCADE,
        version {INTEGER} NOT NULL,
        target {INTEGER} NOT NULL,
        upscale_count {INTEGER} NOT NULL,
        downscale_count {INTEGER} NOT NULL,
        last_decision_at {REAL},
        observed_json {TEXT} NOT NULL
    );
    CREATE TABLE lb_reports (
        service {TEXT} PRIMARY KEY,
        reported_at {REAL} NOT NULL,
        waiting {INTEGER} NOT NULL,
        in_flight_json {TEXT} NOT NULL
    );
    """,),
    # 4: snapshots. Each version's captured workdir and file mounts (a manifest, stored once per digest and
    #    shared by versions), whether its snapshot expired, and whether its update reuses replicas whose
    #    files are identical; a flag asking the controller to collect unreferenced blobs.
    ("""
    CREATE TABLE snapshots (
        digest {TEXT} PRIMARY KEY,
        manifest_json {TEXT} NOT NULL,
        size {INTEGER} NOT NULL
    );
    ALTER TABLE versions ADD COLUMN files_digest {TEXT};
    ALTER TABLE versions ADD COLUMN files_expired {INTEGER} NOT NULL DEFAULT 0;
    ALTER TABLE versions ADD COLUMN reuse_identical_files {INTEGER} NOT NULL DEFAULT 0;
    """,),
    # 5: when a provider's inventory first listed each replica's instance (eventual consistency: before that,
    #    a missing instance may not be listed yet).
    ("""
    ALTER TABLE replicas ADD COLUMN seen_at {REAL};
    """,),
    # 6: submissions by idempotency key (a remote client's retry of `serve up` or `serve update` after a
    #    dropped connection finds the version its first attempt stored instead of storing another).
    ("""
    CREATE TABLE submissions (
        key {TEXT} PRIMARY KEY,
        service {TEXT} NOT NULL,
        version {INTEGER} NOT NULL
    );
    """,),
    # 7: what a submission added to the YAML (``spec.inputs.BoundInputs``): the chosen infra, env values,
    #    secrets by digest (never their values). NULL for older versions: nothing was added.
    ("""
    ALTER TABLE versions ADD COLUMN inputs_json {TEXT};
    """,),
    # 8: what each replica landed on (its placement's instance type and accelerators, "A100:8"): shown by
    #    `serve status`, and the capacity `instance_aware_least_load` weighs it by.
    ("""
    ALTER TABLE replicas ADD COLUMN instance_type {TEXT};
    ALTER TABLE replicas ADD COLUMN accelerator {TEXT};
    """,),
    # 9: an endpoint port the user pinned (`serve up --endpoint-port`): never moved when another process
    #    takes it; the service says so instead.
    ("""
    ALTER TABLE services ADD COLUMN lb_port_pinned {INTEGER} NOT NULL DEFAULT 0;
    """,),
    # 10: replicas an operator asked to terminate (`serve down NAME --replica-id N`). A table of its own, not a
    #    column of `replicas`: the executor writes whole replica rows from what its pass read, and would
    #    overwrite a flag set meanwhile; a request row stays until the executor has acted on it.
    ("""
    CREATE TABLE replica_terminations (
        service {TEXT} NOT NULL REFERENCES services(name) ON DELETE CASCADE,
        replica_id {INTEGER} NOT NULL,
        requested_at {REAL} NOT NULL,
        PRIMARY KEY (service, replica_id)
    );
    """,),
    # 11: the last hour of each autoscaled service's replica counts, a row per minute (`serve status NAME`
    #    draws them beside the request rate, which `request_counts` holds already). The executor writes a
    #    minute's rows on its first pass in that minute and drops those older than an hour.
    ("""
    CREATE TABLE replica_history (
        service {TEXT} NOT NULL REFERENCES services(name) ON DELETE CASCADE,
        minute {INTEGER} NOT NULL,
        ready {INTEGER} NOT NULL,
        target {INTEGER} NOT NULL,
        PRIMARY KEY (service, minute)
    );
    """,),
    # 12: a counter every transaction that writes replica rows increments, so that a controller reading all
    #    replicas each pass reuses what it read last when nothing changed (10,000 rows decoded per pass
    #    were half of a steady pass).
    ("""
    INSERT INTO meta (key, value) VALUES ('replicas_generation', '0') ON CONFLICT (key) DO NOTHING;
    """,),
    # 13: request counts by time, so that a pass counts every service's window in one query reading only the
    #    window's rows (the primary key serves one service at a time).
    ("""
    CREATE INDEX request_counts_by_second ON request_counts (second);
    """,),
    # 14: a counter that moves with every write to a service row or an autoscaler row, whichever process
    #    writes (triggers, so no writer can forget it): a controller reading every service each pass reuses
    #    what it read last while it stands (1,000 service and autoscaler rows fetched per pass were a tenth
    #    of a steady pass over 1,000 services).
    ("""
    INSERT INTO meta (key, value) VALUES ('services_generation', '0') ON CONFLICT (key) DO NOTHING;
    """, CountingTriggers("services_generation", ("services", "autoscaler_state"))),
    # 15: several controllers on one database. Each running loop's row (its heartbeat: a loop whose row is
    #    older than the lease TTL is not live), and one lease per service: who owns it, until when, and a
    #    fencing token that grows at every takeover (``controller.leases``). A service without a lease row
    #    has never been claimed; a released lease keeps its row (and its token) with no owner.
    ("""
    CREATE TABLE controllers (
        loop_id {TEXT} PRIMARY KEY,
        host {TEXT} NOT NULL,
        started_at {REAL} NOT NULL,
        renewed_at {REAL} NOT NULL
    );
    CREATE TABLE service_leases (
        service {TEXT} PRIMARY KEY REFERENCES services(name) ON DELETE CASCADE,
        owner {TEXT},
        expires_at {REAL} NOT NULL,
        token {INTEGER} NOT NULL
    );
    CREATE INDEX service_leases_by_owner ON service_leases (owner);
    """,),
    # 16: canary rollouts. The rollout of a service's current version in canary mode, as the controller left
    #    it (step, bake window start, extensions, paused, verdict, the new version's share of the traffic), so
    #    a restarted or taking-over controller continues from the stored step; ``command`` is what a person
    #    asked (`serve rollout NAME promote|abort|pause|resume`) and the controller has not yet acted on.
    #    And requests per version and status class per second as the load balancers saw them (added up, as
    #    request counts are, so several load balancers sum), for the canary judge.
    ("""
    CREATE TABLE canary_rollouts (
        service {TEXT} PRIMARY KEY REFERENCES services(name) ON DELETE CASCADE,
        version {INTEGER} NOT NULL,
        settings_json {TEXT} NOT NULL,
        phase {TEXT} NOT NULL,
        step {INTEGER} NOT NULL,
        window_start {REAL},
        extensions {INTEGER} NOT NULL,
        paused {INTEGER} NOT NULL,
        verdict {TEXT},
        percent {INTEGER} NOT NULL,
        command {TEXT}
    );
    CREATE TABLE version_counts (
        service {TEXT} NOT NULL,
        version {INTEGER} NOT NULL,
        second {INTEGER} NOT NULL,
        status_class {TEXT} NOT NULL,
        count {INTEGER} NOT NULL,
        PRIMARY KEY (service, version, second, status_class)
    );
    CREATE INDEX version_counts_by_second ON version_counts (second);
    """,),
    # 17: a load balancer on every controller host: one load report per service and load balancer (``lb``:
    #    the host and address it listens on), summed by the reader. Reports are replaced every 2 s, so the
    #    old table's rows are dropped rather than carried over.
    ("""
    DROP TABLE lb_reports;
    CREATE TABLE lb_reports (
        service {TEXT} NOT NULL,
        lb {TEXT} NOT NULL,
        reported_at {REAL} NOT NULL,
        waiting {INTEGER} NOT NULL,
        in_flight_json {TEXT} NOT NULL,
        PRIMARY KEY (service, lb)
    );
    """,),
    # The address each load balancer actually bound and its pid, one row per service and host (a load
    #    balancer that moves to another port replaces its row; one that stops deletes it), written by the
    #    load balancer once it listens: what a status shows as the endpoint's process, next to the identity
    #    its endpoint answers (``endpoint_identity.IDENTITY_PATH``).
    ("""
    CREATE TABLE lb_endpoints (
        service {TEXT} NOT NULL REFERENCES services(name) ON DELETE CASCADE,
        host {TEXT} NOT NULL,
        address {TEXT} NOT NULL,
        pid {INTEGER} NOT NULL,
        bound_at {REAL} NOT NULL,
        PRIMARY KEY (service, host)
    );
    """,),
    # Change detection in the database for every table whose rows a controller pass keeps across passes: a
    #    counter per service, moved by triggers at every write to a row the pass reads of that service (its
    #    row, replicas, versions, autoscaler state, termination requests), whichever controller or process
    #    writes it, which the pass keys what it keeps of the service by. It replaces ``replicas_generation``
    #    (migration 12), which writers moved by hand and nothing reads any more. No foreign key: a service
    #    deleted and created again under its name counts on from where it was, so nothing kept from before
    #    can match again.
    ("""
    CREATE TABLE service_changes (
        service {TEXT} PRIMARY KEY,
        generation {INTEGER} NOT NULL
    );
    INSERT INTO service_changes (service, generation) SELECT name, 1 FROM services;
    DELETE FROM meta WHERE key = 'replicas_generation';
    """, ServiceCountingTriggers("service_changes", (("replicas", "service"), ("versions", "service"),
                                                     ("autoscaler_state", "service"),
                                                     ("replica_terminations", "service")))),
    # Blobs in the database, for a store on PostgreSQL (``state.blob_table``): every controller host reads
    #    the files of every version, whichever host's CLI submitted it. Chunks of 1 MiB by (digest, index),
    #    and a row per complete blob, written last. Created on SQLite too (one schema), where nothing uses it:
    #    the home's blob folder is the one every process of that one host reads.
    ("""
    CREATE TABLE blob_chunks (
        digest {TEXT} NOT NULL,
        chunk {INTEGER} NOT NULL,
        data {BLOB} NOT NULL,
        PRIMARY KEY (digest, chunk)
    );
    CREATE TABLE blobs (
        digest {TEXT} PRIMARY KEY,
        size {INTEGER} NOT NULL,
        chunks {INTEGER} NOT NULL,
        stored_at {REAL} NOT NULL
    );
    """,),
    # Canary rollouts in the counter per service (``service_changes``): a pass reads a service's rollout as it reads
    #    its other rows, so a person's `serve rollout` command moves the service's counter like any write.
    #    (The load balancers' per-second counts, like request counts, are read afresh every pass.)
    (ServiceCountingTriggers("service_changes", (("canary_rollouts", "service"),), services=False),),
)
