package client

import (
	"os"
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
)

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
// the program chose wins).
func (c *Config) ApplyEnv() error {
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
