package master

import (
	"net"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/nspath"
)

// checkHeartbeat refuses a heartbeat before it changes anything, in memory
// or in the store: a server id follows the name rule, its address is
// host:port, the rest is text PostgreSQL can hold (issue 22 finding 10: a
// refused "x\x00" was left up in memory).
func checkHeartbeat(hb api.Heartbeat) error {
	if hb.ID == "" || hb.Addr == "" {
		return errs.New(errs.ErrBadRequest, "heartbeat needs id and addr")
	}
	if err := nspath.CheckName("server id", hb.ID); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(hb.Addr); err != nil {
		return errs.New(errs.ErrBadRequest, "heartbeat addr %.64q: want host:port (%v)", hb.Addr, err)
	}
	for _, s := range []string{hb.Addr, hb.Unhealthy} {
		if err := nspath.CheckText("heartbeat", s); err != nil {
			return err
		}
	}
	return nil
}
