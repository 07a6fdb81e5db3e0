package client

import (
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
	for _, bad := range []string{"soon", "-1s", "48h", "5"} {
		t.Setenv(EnvIOTimeout, bad)
		var c Config
		if err := c.ApplyEnv(); !errors.Is(err, errs.ErrBadRequest) {
			t.Fatalf("%s=%q: want a bad request, got %v", EnvIOTimeout, bad, err)
		}
	}
}
