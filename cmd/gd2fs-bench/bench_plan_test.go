package main

import (
	"path/filepath"
	"testing"
)

// TestBenchPlanSmall runs gd2fs-bench plan on a small table, both set-ups:
// the seeded copies plan, warm, restart and evict under the quota, whose
// victims the command checks are exactly the least recently used idle
// sessions in order (it fails otherwise); then --reuse on the same file.
func TestBenchPlanSmall(t *testing.T) {
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "p.db")
	for _, args := range [][]string{
		{"plan", "--sessions", "60", "--plans", "6", "--concurrency", "4", "--warm", "--restart", "--quota-plans", "5", "--meta", dsn},
		{"plan", "--sessions", "60", "--plans", "3", "--reuse", "--from", "20", "--quota-plans", "3", "--meta", dsn},
		{"plan", "--sessions", "12", "--plans", "10", "--setup", "api", "--turns", "2"},
	} {
		root := newRoot()
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatalf("gd2fs-bench %v: %v", args, err)
		}
	}
}
