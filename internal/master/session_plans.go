package master

import (
	"net/http"
	"strconv"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/meta"
)

// outstandingPlan answers GET /v1/sessions/{id}/plans/{plan}: the fresh
// range an outstanding plan reserved, so a client that holds only the plan
// id (gd2fs session write) can write it before the commit.
func (m *Master) outstandingPlan(r *http.Request) (any, error) {
	id, err := strconv.ParseInt(r.PathValue("plan"), 10, 64)
	if err != nil || id <= 0 {
		return nil, errs.New(errs.ErrBadRequest, "plan id %q: want the plan_id a plan answered", r.PathValue("plan"))
	}
	pr, ok := m.sessions.(meta.PlanReader)
	if !ok {
		return nil, errs.New(errs.ErrBadRequest, "this master's session store cannot show outstanding plans")
	}
	fr, err := pr.OutstandingPlan(r.Context(), r.PathValue("id"), id)
	if err != nil {
		return nil, err
	}
	out := api.Plan{PlanID: id, Stored: []api.KVRange{}, Fresh: []api.KVRange{}}
	if fr.KVLength > 0 {
		out.Fresh = m.rangesOut([]meta.Range{fr})
	}
	return out, nil
}
