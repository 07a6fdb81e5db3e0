package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

func TestApplyEnv(t *testing.T) {
	t.Setenv(EnvIOTimeout, "3s")
	t.Setenv(EnvMasterRetry, "0")
	var c Config
	if err := c.ApplyEnv(); err != nil {
		t.Fatal(err)
	}
	if c.Timeout != 3*time.Second || c.MasterRetry != -1 {
		t.Fatalf("got timeout %v, master retry %v", c.Timeout, c.MasterRetry)
	}
	c = Config{Timeout: time.Second, MasterRetry: time.Minute} // the program's choice wins
	if err := c.ApplyEnv(); err != nil || c.Timeout != time.Second || c.MasterRetry != time.Minute {
		t.Fatalf("overrode the program's values: %+v %v", c, err)
	}
	if c.PlainHTTP {
		t.Fatal("PlainHTTP without GD2FS_PLAIN_HTTP")
	}
	t.Setenv(EnvPlainHTTP, "1")
	if err := c.ApplyEnv(); err != nil || !c.PlainHTTP {
		t.Fatalf("%s=1: PlainHTTP %v, %v", EnvPlainHTTP, c.PlainHTTP, err)
	}
	t.Setenv(EnvPlainHTTP, "sometimes")
	if err := c.ApplyEnv(); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("%s=sometimes: %v", EnvPlainHTTP, err)
	}
	t.Setenv(EnvPlainHTTP, "")
	for _, bad := range []string{"soon", "-1s", "48h", "5"} {
		t.Setenv(EnvIOTimeout, bad)
		var c Config
		if err := c.ApplyEnv(); !errors.Is(err, errs.ErrBadRequest) {
			t.Fatalf("%s=%q: want a bad request, got %v", EnvIOTimeout, bad, err)
		}
	}
}

// A KV request's deadline grows with the bytes it moves, as a file
// request's does: Timeout + n/MinRate.
func TestKVDeadlineScalesWithSize(t *testing.T) {
	c, err := New(Config{Master: "http://127.0.0.1:1", Timeout: time.Second, MinRate: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	kv := c.KV("perf")
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{{0, time.Second}, {4 << 20, 5 * time.Second}} {
		ctx, cancel := kv.ctx(context.Background(), tc.n)
		dl, ok := ctx.Deadline()
		cancel()
		if got := time.Until(dl); !ok || got > tc.want || got < tc.want-time.Second/2 {
			t.Fatalf("%d bytes: deadline in %v, want about %v", tc.n, got, tc.want)
		}
	}
}
