-- Evora schema, version 58: what the planner expects a probe of evora.spawned_children by
-- parent to find (docs/jobs-that-wait.md, "Cancelling a waiting job"). A cancel reads the
-- tree of its job's children (evora.spawned_tree()) by probing the children of each job in
-- it, most of them children with none of their own. ANALYZE sets the estimate of a probe to
-- the table's rows over its parents, so a few spawns of thousands of children made it
-- thousands: the planner then filtered the whole table once and compared every job of the
-- tree with every row of it (a cancel of 20,000 children: 400 million pairs, 72 s, in each
-- of its two reads). Counting every parent distinct puts a probe at about a row, what a
-- child's probe finds: one index probe per job of the tree. Analysed again now, so that
-- the estimate holds before autovacuum next gets to the table.
ALTER TABLE evora.spawned_children ALTER COLUMN parent SET (n_distinct = -1);
ANALYZE evora.spawned_children;
