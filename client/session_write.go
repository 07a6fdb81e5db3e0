package client

import (
	"context"
	"strconv"
)

// OutstandingPlan returns plan planID of session id as far as writing it
// needs: its plan_id and fresh_kv_cache (stored_kv_cache is empty). It
// fails with errs.ErrNotFound once the plan has committed or expired.
func (s *Sessions) OutstandingPlan(ctx context.Context, id string, planID int64) (Plan, error) {
	var p Plan
	err := s.c.api.Do(ctx, "GET", "/v1/sessions/"+esc(id)+"/plans/"+strconv.FormatInt(planID, 10), nil, &p)
	return p, err
}
