package client

import (
	"os"
	"strconv"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// Environment variables that tune a client where its program has no flag for
// it (an inference engine constructing a pygd2fs Client, or the CLI without
// --io-timeout / --master-retry): Go durations such as "5s" or "1m30s".
// GD2FS_IO_TIMEOUT=0 means the default (10s), as --io-timeout 0 does.
const (
	EnvIOTimeout   = "GD2FS_IO_TIMEOUT"   // Config.Timeout
	EnvMasterRetry = "GD2FS_MASTER_RETRY" // Config.MasterRetry; "0": one try of each master
	// EnvPlainHTTP=1 sets Config.PlainHTTP: every master call as an HTTP
	// request, none on framed connections (to compare, or behind a proxy
	// that passes HTTP upgrades but not what follows them).
	EnvPlainHTTP = "GD2FS_PLAIN_HTTP"
)

// BoolEnv reads a boolean (1, true, 0, false, ...) from the environment
// variable name: false when unset or empty; anything else is an error that
// names the variable.
func BoolEnv(name string) (bool, error) {
	s := os.Getenv(name)
	if s == "" {
		return false, nil
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		return false, errs.New(errs.ErrBadRequest, "%s=%q: want 1 or 0 (true or false)", name, s)
	}
	return v, nil
}

// DurationEnv reads a duration from the environment variable name: set is
// false when it is unset or empty; a value that is not a duration between 0
// and 24h is an error that names the variable.
func DurationEnv(name string) (d time.Duration, set bool, err error) {
	s := os.Getenv(name)
	if s == "" {
		return 0, false, nil
	}
	d, err = time.ParseDuration(s)
	if err != nil || d < 0 || d > 24*time.Hour {
		return 0, false, errs.New(errs.ErrBadRequest, "%s=%q: want a duration from 0 to 24h, such as 5s or 1m30s", name, s)
	}
	return d, true, nil
}

// ApplyEnv sets Timeout and MasterRetry from GD2FS_IO_TIMEOUT and
// GD2FS_MASTER_RETRY where those are set and the fields are zero (a value
// the program chose wins), and PlainHTTP from GD2FS_PLAIN_HTTP when it is
// true.
func (c *Config) ApplyEnv() error {
	if v, err := BoolEnv(EnvPlainHTTP); err != nil {
		return err
	} else if v {
		c.PlainHTTP = true
	}
	if d, set, err := DurationEnv(EnvIOTimeout); err != nil {
		return err
	} else if set && c.Timeout == 0 {
		c.Timeout = d
	}
	if d, set, err := DurationEnv(EnvMasterRetry); err != nil {
		return err
	} else if set && c.MasterRetry == 0 {
		c.MasterRetry = d
		if d == 0 {
			c.MasterRetry = -1 // Config's 0 means the default
		}
	}
	return nil
}
