package api

import (
	"encoding/json"
	"net/http"
)

// HealthRoutes adds the probe endpoints the master and the data servers
// both serve (docs/deploy.md): GET /healthz answers 200 "ok" while the
// process serves HTTP; GET /readyz answers the JSON body ready returns,
// 200 when ready says ok and 503 otherwise, never cached. What "ready"
// means is each caller's (master/health.go, server/health.go).
func HealthRoutes(mux *http.ServeMux, ready func(r *http.Request) (body any, ok bool)) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		body, ok := ready(r)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(body)
	})
}
