package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/placement"
	"github.com/gd2fs/gd2fs/internal/store"
)

// TestHeartbeatRepliesOutOfOrder: the heartbeat loop's request and a
// refresh run at once; the loop's reply, with the older epoch, comes back
// last (here a master that holds it). The server must keep the newer map:
// going back to the older one after telling a peer it had the newer one
// (kvCatchUp), it would serve keys the peer is moving away. A later
// heartbeat's reply with a lower epoch (a master on a new store) is taken.
func TestHeartbeatRepliesOutOfOrder(t *testing.T) {
	var n atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	epochs := []int64{5, 6, 1} // the first reply is held until release
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1) - 1
		if r.URL.Path != "/v1/servers/heartbeat" || int(i) >= len(epochs) {
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		if i == 0 {
			close(entered)
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(api.HeartbeatReply{Membership: api.Membership{Epoch: epochs[i],
			Members: []placement.Member{{ID: "s1", Addr: "127.0.0.1:1"}}}})
	}))
	defer fake.Close()
	s, err := New(Config{ID: "s1", Listen: "127.0.0.1:0", Master: fake.URL, Heartbeat: time.Hour, Store: store.Config{MemBytes: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { first <- s.heartbeat(ctx) }()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("the first heartbeat did not reach the master")
	}
	if err := s.heartbeat(ctx); err != nil {
		close(release)
		t.Fatal(err)
	}
	if ms := s.membership(); ms == nil || ms.Epoch != 6 {
		close(release)
		t.Fatalf("after the second reply: %+v, want epoch 6", ms)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if ms := s.membership(); ms.Epoch != 6 {
		t.Fatalf("the first heartbeat's late reply took the map back to epoch %d from 6", ms.Epoch)
	}
	if err := s.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if ms := s.membership(); ms.Epoch != 1 {
		t.Fatalf("a later reply with a lower epoch (a master on a new store): map at epoch %d, want 1", ms.Epoch)
	}
}
