package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestProcCPU: this process's CPU time grows while it spins.
func TestProcCPU(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
		x++
	}
	after, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Fatalf("CPU time did not grow: %v -> %v (%d)", before, after, x)
	}
}

// TestPGMeter: the turns bench finds a PostgreSQL server on this machine
// by its backend's parent and counts the CPU of its processes, which
// grows while a backend works.
func TestPGMeter(t *testing.T) {
	dsn := os.Getenv("GD2FS_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("set GD2FS_TEST_POSTGRES (scripts/test.sh starts a server)")
	}
	ctx := context.Background()
	pm, err := postmasterOf(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if pm <= 0 {
		t.Fatalf("postmaster pid %d for a server on this machine", pm)
	}
	m := &pgMeter{postmaster: pm}
	m.Start()
	if _, ok := m.start[reaped]; !ok {
		t.Fatalf("no reaped children's time for postmaster %d", pm)
	}
	if procs := len(m.start) - 1; procs < 2 {
		t.Fatalf("found %d processes of postmaster %d, want it and its children", procs, pm)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var backend int
	var n int64
	// A quarter of a second of a backend's CPU: more than a 10 ms clock
	// tick. The backend is new (started after Start) and ends before the
	// meter is read, as a pool's closed connections do: its time must
	// still count.
	if err := conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM generate_series(1, 5000000)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	// Back to the pool, and the pool closed: the backend's connection ends.
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", backend)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d did not end after its connection closed", backend)
		}
	}
	if d := m.total(); d < 100*time.Millisecond {
		t.Fatalf("PostgreSQL's CPU grew %v while a backend, ended since, counted %d rows (a quarter of a second's work)", d, n)
	}
	// The ended backend's time is in the reaped children's: without them
	// the check above could still pass on other backends' work.
	if d := m.sample()[reaped] - m.start[reaped]; d < 100*time.Millisecond {
		t.Fatalf("the postmaster's reaped children's CPU grew %v while a backend that ended counted %d rows", d, n)
	}
}

// TestPGWAL: the turns bench's WAL meter reads a server's WAL position,
// which moves by at least what a table's rows take.
func TestPGWAL(t *testing.T) {
	dsn := os.Getenv("GD2FS_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("set GD2FS_TEST_POSTGRES (scripts/test.sh starts a server)")
	}
	ctx := context.Background()
	lsn, _, err := pgWAL(ctx, dsn, "")
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	table := fmt.Sprintf("wal_meter_%d", os.Getpid())
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (v text)`); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := db.ExecContext(ctx, `DROP TABLE `+table); err != nil {
			t.Error(err)
		}
	}()
	// 1,000 rows of 1,000 bytes: about 1 MB of WAL.
	if _, err := db.ExecContext(ctx, `INSERT INTO `+table+` SELECT repeat('x', 1000) FROM generate_series(1, 1000)`); err != nil {
		t.Fatal(err)
	}
	_, grew, err := pgWAL(ctx, dsn, lsn)
	if err != nil {
		t.Fatal(err)
	}
	if grew < 1000*1000 {
		t.Fatalf("the WAL grew %d bytes from %s while 1,000 rows of 1,000 bytes were written", grew, lsn)
	}
}
