package tcp

import "testing"

// TestLocalFor: streams to a server go out through every NIC given, loopback
// addresses serve loopback servers only and the others the rest (issue 28:
// GD2FS_DEVICE_NICS gives one data-plane address per NIC).
func TestLocalFor(t *testing.T) {
	p := NewPool(Options{Streams: 4, LocalAddrs: []string{"127.0.0.1", "127.0.0.2", "10.1.1.1", "10.1.1.2"}})
	for _, tc := range []struct {
		addr string
		want map[string]bool
	}{
		{"127.0.0.1:7071", map[string]bool{"127.0.0.1": true, "127.0.0.2": true}},
		{"localhost:7071", map[string]bool{"127.0.0.1": true, "127.0.0.2": true}},
		{"10.0.0.9:7071", map[string]bool{"10.1.1.1": true, "10.1.1.2": true}},
	} {
		seen := map[string]int{}
		for i := 0; i < 4; i++ {
			l := p.localFor(tc.addr, i)
			if !tc.want[l] {
				t.Fatalf("%s stream %d binds %q, want one of %v", tc.addr, i, l, tc.want)
			}
			seen[l]++
		}
		for l := range tc.want {
			if seen[l] != 2 {
				t.Fatalf("%s: streams per local address %v, want 2 each", tc.addr, seen)
			}
		}
	}
	only := NewPool(Options{Streams: 2, LocalAddrs: []string{"127.0.0.1"}})
	if l := only.localFor("10.0.0.9:7071", 0); l != "" {
		t.Fatalf("a loopback address bound for a remote server: %q", l)
	}
	if l := NewPool(Options{Streams: 2}).localFor("127.0.0.1:1", 1); l != "" {
		t.Fatalf("no local addresses: %q", l)
	}
}
