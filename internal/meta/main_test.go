package meta

import (
	"os"
	"testing"
)

// TestMain turns on the invariant check after every transaction
// (invariants.go) for every store the tests open, unless
// GD2FS_META_INVARIANTS=0 (to see what the other checks catch alone).
func TestMain(m *testing.M) {
	if os.Getenv("GD2FS_META_INVARIANTS") == "" {
		os.Setenv("GD2FS_META_INVARIANTS", "1")
	}
	os.Exit(m.Run())
}
