-- Folds a bounded batch of the tenant's usage log into its rollups (`fold_usage`): the sweep's
-- step for a tenant that charged since its last visit. Answers how many entries were folded
-- and whether the log has more.
local folded, more = fold_usage(K.usage_log, tonumber(A.max_groups), tonumber(A.retention_ms), tonumber(A.limit))
return ok({folded = folded, more = more})
