-- The schema that shared/evora/storage/migrations/ build, as pg_dump prints it (normalised:
-- no comments, no session settings). Never edit by hand: a test compares it with a freshly
-- migrated database; after adding a migration, regenerate it with
--     PYTHONPATH=shared:. python -m tests.schemadump

CREATE TYPE public.job_state AS ENUM (
    'PENDING',
    'RUNNING',
    'COMPLETED',
    'DLQ',
    'CANCELLED'
);

CREATE TYPE public.job_image AS (
	id uuid,
	queue text,
	type text,
	state public.job_state,
	priority smallint,
	group_key text,
	idempotency_key text,
	attempt integer,
	max_attempts integer,
	lease_seconds integer,
	run_at timestamp with time zone,
	expires_at timestamp with time zone,
	lease_expires_at timestamp with time zone,
	worker_id text,
	cancel_requested boolean,
	last_error jsonb,
	version integer,
	submit_seq bigint,
	created_at timestamp with time zone,
	updated_at timestamp with time zone,
	started_at timestamp with time zone,
	finished_at timestamp with time zone
);

CREATE FUNCTION public.evora_backoff_seconds(initial double precision, max_seconds double precision, multiplier double precision, n integer) RETURNS double precision
    LANGUAGE sql
    AS $$
    SELECT least(
        max_seconds,
        exp(least(ln(initial) + greatest(n - 1, 0) * ln(multiplier), ln(max_seconds) + 1))
            * (0.8 + 0.4 * random()))
$$;

CREATE FUNCTION public.evora_drop_archived_events(upto_seq bigint, older_than_seconds double precision, max_rows integer) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO '$user', 'public'
    AS $$
DECLARE
    mark     event_archive_watermark;
    consumed xid8;
    removed  bigint;
BEGIN
    IF older_than_seconds IS NULL OR older_than_seconds < 0 OR max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION 'invalid retention arguments (older than %, at most % rows)',
            older_than_seconds, max_rows USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO STRICT mark FROM event_archive_watermark;
    IF upto_seq IS NULL OR upto_seq > mark.upto_seq THEN
        RAISE EXCEPTION 'refusing to drop events up to seq %: the archive reaches only seq %',
            upto_seq, mark.upto_seq USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT p.xid INTO consumed FROM projector_progress p ORDER BY p.xid LIMIT 1;
    IF consumed IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM set_config('evora.drop_archived_events', 'on', true);
    WITH gone AS (
        DELETE FROM job_events
        WHERE seq IN (
            SELECT e.seq FROM job_events e
            WHERE e.seq <= upto_seq AND e.xid < mark.below_xid AND e.xid < consumed
              AND e.at < now() - make_interval(secs => older_than_seconds)
            ORDER BY e.seq
            LIMIT max_rows
        )
        RETURNING 1
    )
    SELECT count(*) INTO removed FROM gone;
    PERFORM set_config('evora.drop_archived_events', 'off', true);
    RETURN removed;
END
$$;

CREATE TABLE public.jobs (
    id uuid NOT NULL,
    submit_seq bigint NOT NULL,
    queue text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    state public.job_state DEFAULT 'PENDING'::public.job_state NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    group_key text,
    idempotency_key text,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    lease_seconds integer NOT NULL,
    backoff_initial double precision NOT NULL,
    backoff_max double precision NOT NULL,
    backoff_multiplier double precision NOT NULL,
    run_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone,
    lease_token uuid,
    lease_expires_at timestamp with time zone,
    worker_id text,
    cancel_requested boolean DEFAULT false NOT NULL,
    result jsonb,
    last_error jsonb,
    progress jsonb,
    version integer DEFAULT 1 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    CONSTRAINT jobs_attempt_check CHECK ((attempt >= 0)),
    CONSTRAINT jobs_backoff_initial_check CHECK ((backoff_initial > (0)::double precision)),
    CONSTRAINT jobs_backoff_multiplier_check CHECK ((backoff_multiplier >= (1)::double precision)),
    CONSTRAINT jobs_cancel_request_only_while_running CHECK (((NOT cancel_requested) OR (state = ANY (ARRAY['RUNNING'::public.job_state, 'CANCELLED'::public.job_state, 'COMPLETED'::public.job_state])))),
    CONSTRAINT jobs_check CHECK ((backoff_max >= backoff_initial)),
    CONSTRAINT jobs_finished_at_iff_done CHECK (((state = ANY (ARRAY['COMPLETED'::public.job_state, 'CANCELLED'::public.job_state, 'DLQ'::public.job_state])) = (finished_at IS NOT NULL))),
    CONSTRAINT jobs_lease_seconds_check CHECK (((lease_seconds >= 1) AND (lease_seconds <= 86400))),
    CONSTRAINT jobs_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 1000))),
    CONSTRAINT jobs_running_has_lease CHECK (((state <> 'RUNNING'::public.job_state) OR ((lease_token IS NOT NULL) AND (lease_expires_at IS NOT NULL))))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_insert_scale_factor='0.01', autovacuum_analyze_scale_factor='0.02');
ALTER TABLE ONLY public.jobs ALTER COLUMN state SET STATISTICS 0;

CREATE FUNCTION public.evora_job_image(j public.jobs) RETURNS public.job_image
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT ROW(j.id, j.queue, j.type, j.state, j.priority, j.group_key, j.idempotency_key,
               j.attempt, j.max_attempts, j.lease_seconds, j.run_at, j.expires_at,
               j.lease_expires_at, j.worker_id, j.cancel_requested, j.last_error, j.version,
               j.submit_seq, j.created_at, j.updated_at, j.started_at, j.finished_at)::job_image
$$;

CREATE FUNCTION public.evora_now() RETURNS timestamp with time zone
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT now() + coalesce(nullif(current_setting('evora.clock_offset', true), '')::interval,
                            interval '0')
$$;

CREATE FUNCTION public.evora_reject_event_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('evora.drop_archived_events', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'job_events is append-only (% rejected)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE FUNCTION public.evora_reject_illegal_transition() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'a new job must be PENDING, not %', NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM job_transitions t
        WHERE t.from_state = OLD.state AND t.to_state = NEW.state
    ) THEN
        RAISE EXCEPTION 'illegal job transition % -> % (job %)', OLD.state, NEW.state, OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION public.evora_reject_live_delete() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'job % is % and may not be deleted', OLD.id, OLD.state
        USING ERRCODE = 'check_violation';
END
$$;

CREATE FUNCTION public.evora_reject_unarchived_delete() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM event_archive_watermark w
        WHERE OLD.seq <= w.upto_seq AND OLD.xid < w.below_xid
    ) THEN
        RAISE EXCEPTION 'event % is not archived and may not be deleted', OLD.seq
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN OLD;
END
$$;

CREATE TABLE public.event_archive_runs (
    run_id text NOT NULL,
    from_seq bigint NOT NULL,
    upto_seq bigint NOT NULL,
    from_xid xid8 NOT NULL,
    below_xid xid8 NOT NULL,
    events bigint NOT NULL,
    max_seq bigint NOT NULL,
    partitions jsonb NOT NULL,
    committed_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT event_archive_runs_events_check CHECK ((events > 0))
);

CREATE TABLE public.event_archive_watermark (
    singleton boolean DEFAULT true NOT NULL,
    upto_seq bigint NOT NULL,
    below_xid xid8 NOT NULL,
    archived bigint NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT event_archive_watermark_archived_check CHECK ((archived >= 0)),
    CONSTRAINT event_archive_watermark_singleton_check CHECK (singleton),
    CONSTRAINT event_archive_watermark_upto_seq_check CHECK ((upto_seq >= 0))
);

CREATE TABLE public.evora_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.idempotency_keys (
    queue text NOT NULL,
    key text NOT NULL,
    fingerprint bytea NOT NULL,
    job_id uuid NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.job_events (
    seq bigint NOT NULL,
    xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    job_id uuid NOT NULL,
    job_version integer NOT NULL,
    queue text NOT NULL,
    type text NOT NULL,
    event text NOT NULL,
    from_state public.job_state,
    to_state public.job_state NOT NULL,
    attempt integer NOT NULL,
    worker_id text,
    at timestamp with time zone NOT NULL,
    data jsonb DEFAULT '{}'::jsonb NOT NULL,
    job public.job_image NOT NULL
);

ALTER TABLE public.job_events ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.job_events_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.job_prune_counts (
    queue text NOT NULL,
    state public.job_state NOT NULL,
    pruned bigint NOT NULL,
    CONSTRAINT job_prune_counts_finished_only CHECK ((state = ANY (ARRAY['COMPLETED'::public.job_state, 'CANCELLED'::public.job_state, 'DLQ'::public.job_state]))),
    CONSTRAINT job_prune_counts_pruned_check CHECK ((pruned >= 0))
);

CREATE TABLE public.job_transitions (
    from_state public.job_state,
    to_state public.job_state NOT NULL,
    event text NOT NULL
);

ALTER TABLE public.jobs ALTER COLUMN submit_seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.jobs_submit_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.paused_queues (
    queue text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.projector_progress (
    generation integer NOT NULL,
    xid xid8 NOT NULL,
    seq bigint NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE ONLY public.event_archive_runs
    ADD CONSTRAINT event_archive_runs_pkey PRIMARY KEY (run_id);

ALTER TABLE ONLY public.event_archive_watermark
    ADD CONSTRAINT event_archive_watermark_pkey PRIMARY KEY (singleton);

ALTER TABLE ONLY public.evora_migrations
    ADD CONSTRAINT evora_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY public.idempotency_keys
    ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (queue, key);

ALTER TABLE ONLY public.job_events
    ADD CONSTRAINT job_events_pkey PRIMARY KEY (seq);

ALTER TABLE ONLY public.job_events
    ADD CONSTRAINT job_events_version_once UNIQUE (job_id, job_version);

ALTER TABLE ONLY public.job_prune_counts
    ADD CONSTRAINT job_prune_counts_pkey PRIMARY KEY (queue, state);

ALTER TABLE ONLY public.job_transitions
    ADD CONSTRAINT job_transitions_from_state_to_state_event_key UNIQUE (from_state, to_state, event);

ALTER TABLE ONLY public.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.paused_queues
    ADD CONSTRAINT paused_queues_pkey PRIMARY KEY (queue);

ALTER TABLE ONLY public.projector_progress
    ADD CONSTRAINT projector_progress_pkey PRIMARY KEY (generation);

CREATE INDEX idempotency_keys_age ON public.idempotency_keys USING btree (created_at);

CREATE INDEX job_events_tail ON public.job_events USING btree (xid, seq);

CREATE INDEX jobs_claimable ON public.jobs USING btree (queue, priority, run_at, submit_seq) WHERE (state = 'PENDING'::public.job_state);

CREATE INDEX jobs_finished ON public.jobs USING btree (state, finished_at) WHERE (state = ANY (ARRAY['COMPLETED'::public.job_state, 'CANCELLED'::public.job_state, 'DLQ'::public.job_state]));

CREATE INDEX jobs_group_pending ON public.jobs USING btree (queue, group_key, priority, submit_seq) WHERE ((state = 'PENDING'::public.job_state) AND (group_key IS NOT NULL));

CREATE UNIQUE INDEX jobs_group_running ON public.jobs USING btree (queue, group_key) WHERE ((state = 'RUNNING'::public.job_state) AND (group_key IS NOT NULL));

CREATE INDEX jobs_listing ON public.jobs USING btree (queue, state, submit_seq);

CREATE INDEX jobs_pending_ttl ON public.jobs USING btree (expires_at) WHERE ((state = 'PENDING'::public.job_state) AND (expires_at IS NOT NULL) AND (started_at IS NULL));

CREATE INDEX jobs_running_lease ON public.jobs USING btree (lease_expires_at) WHERE (state = 'RUNNING'::public.job_state);

CREATE INDEX jobs_scheduled ON public.jobs USING btree (queue, run_at) WHERE (state = 'PENDING'::public.job_state);

CREATE UNIQUE INDEX jobs_submit_seq ON public.jobs USING btree (submit_seq);

CREATE TRIGGER job_events_append_only BEFORE DELETE OR UPDATE ON public.job_events FOR EACH STATEMENT EXECUTE FUNCTION public.evora_reject_event_change();

CREATE TRIGGER job_events_delete_archived_only BEFORE DELETE ON public.job_events FOR EACH ROW EXECUTE FUNCTION public.evora_reject_unarchived_delete();

CREATE TRIGGER job_events_no_truncate BEFORE TRUNCATE ON public.job_events FOR EACH STATEMENT EXECUTE FUNCTION public.evora_reject_event_change();

CREATE TRIGGER jobs_live_delete_guard BEFORE DELETE ON public.jobs FOR EACH ROW WHEN ((old.state = ANY (ARRAY['PENDING'::public.job_state, 'RUNNING'::public.job_state]))) EXECUTE FUNCTION public.evora_reject_live_delete();

CREATE TRIGGER jobs_new_state_guard BEFORE INSERT ON public.jobs FOR EACH ROW WHEN ((new.state <> 'PENDING'::public.job_state)) EXECUTE FUNCTION public.evora_reject_illegal_transition();

CREATE TRIGGER jobs_transition_guard BEFORE UPDATE OF state ON public.jobs FOR EACH ROW WHEN (((old.state IS DISTINCT FROM new.state) AND ((((((((((old.state <> 'DLQ'::public.job_state) OR (new.state <> 'CANCELLED'::public.job_state)) AND ((old.state <> 'DLQ'::public.job_state) OR (new.state <> 'PENDING'::public.job_state))) AND ((old.state <> 'PENDING'::public.job_state) OR (new.state <> 'CANCELLED'::public.job_state))) AND ((old.state <> 'PENDING'::public.job_state) OR (new.state <> 'DLQ'::public.job_state))) AND ((old.state <> 'PENDING'::public.job_state) OR (new.state <> 'RUNNING'::public.job_state))) AND ((old.state <> 'RUNNING'::public.job_state) OR (new.state <> 'CANCELLED'::public.job_state))) AND ((old.state <> 'RUNNING'::public.job_state) OR (new.state <> 'COMPLETED'::public.job_state))) AND ((old.state <> 'RUNNING'::public.job_state) OR (new.state <> 'DLQ'::public.job_state))) AND ((old.state <> 'RUNNING'::public.job_state) OR (new.state <> 'PENDING'::public.job_state))))) EXECUTE FUNCTION public.evora_reject_illegal_transition();
