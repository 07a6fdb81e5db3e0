package master

import "testing"

// TestHeldGap: the first bytes some replica lacks, across chunks, with the
// replica that lacks them; a chunk never allocated is a gap of its own.
func TestHeldGap(t *testing.T) {
	h := &heldFile{chunkSize: 100, chunks: map[int64]*heldChunk{
		0: {servers: []string{"a", "b"}, ext: [][]int64{{0, 100}, {0, 100}}},
		1: {servers: []string{"a", "b", "c"}, ext: [][]int64{{0, 100}, {0, 40, 60, 100}, {0, 50, 55, 100}}},
		3: {servers: []string{"a"}, ext: [][]int64{{0, 100}}},
		4: {servers: nil},
	}}
	for _, tc := range []struct {
		start, end, gs, ge int64
		server             string
		ok                 bool
	}{
		{0, 100, 0, 0, "", false},
		{0, 140, 0, 0, "", false},
		{0, 150, 140, 150, "b", true},   // b lacks 140..160, c from 150
		{145, 160, 145, 160, "b", true}, // b first, to where b holds again
		{160, 200, 0, 0, "", false},
		{160, 250, 200, 250, "", true}, // chunk 2 never allocated
		{300, 400, 0, 0, "", false},
		{300, 450, 400, 450, "", true}, // a chunk without replicas holds nothing
	} {
		gs, ge, server, ok := h.gap(tc.start, tc.end)
		if ok != tc.ok || gs != tc.gs || ge != tc.ge || server != tc.server {
			t.Errorf("gap(%d, %d) = %d, %d, %q, %v; want %d, %d, %q, %v", tc.start, tc.end, gs, ge, server, ok, tc.gs, tc.ge, tc.server, tc.ok)
		}
	}
}
