-- Evora schema, version 21: evora.for_each_item(), so that a submitting statement can pass
-- a value every item of the call shares once instead of once per item.
--
-- A batch of a thousand submissions usually differs only in its payloads: the queue, the
-- type, the priority, the attempts, the lease, the backoff and the absent fields are the
-- same for every item. Sent as arrays of a thousand equal elements, they were most of what
-- the api spent encoding a batch's parameters (one type check and one encoding per
-- element); sent as arrays of one element, this spreads them again.

-- `vals` for `items` items: an array of one element stands for that value for every item;
-- any other array is already one element per item (for one item the two are the same).
-- (OR REPLACE: the evora schema outlives the tables of a schema dropped and migrated again.)
CREATE OR REPLACE FUNCTION evora.for_each_item(vals anyarray, items integer) RETURNS anyarray
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN cardinality(vals) = 1 THEN array_fill(vals[1], ARRAY[items]) ELSE vals END
$$;
