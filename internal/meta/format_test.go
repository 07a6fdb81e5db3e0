package meta

import (
	"context"
	"errors"
	"testing"
)

// TestNewerFormatRefused: a leader records the metadata format it writes;
// a store of a newer format (written by a newer gd2fs) is refused by Open,
// and a standby opened before a newer master raised it does not take the
// lead, so an old master never reads rows it does not know.
func TestNewerFormatRefused(t *testing.T) {
	for name, mk := range sharedDSNs {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dsn := mk(t)
			a, standby := openShared(t, dsn), openShared(t, dsn)
			if ok, err := a.Lead(ctx, "http://a"); !ok || err != nil {
				t.Fatalf("a: %v %v", ok, err)
			}
			var v int64
			if err := a.db.QueryRowContext(ctx, `SELECT v FROM counters WHERE k = 'meta_format'`).Scan(&v); err != nil || v != metaFormat {
				t.Fatalf("the leader recorded format %d (%v), want %d", v, err, metaFormat)
			}
			// A newer master led meanwhile and raised the format.
			if _, err := a.db.ExecContext(ctx, a.q(`UPDATE counters SET v = ? WHERE k = 'meta_format'`), metaFormat+1); err != nil {
				t.Fatal(err)
			}
			a.lead.release()
			ok, err := standby.Lead(ctx, "http://standby")
			if ok || !errors.Is(err, errNewerFormat) {
				t.Fatalf("a standby of format %d took the lead of a store of format %d: %v %v", metaFormat, metaFormat+1, ok, err)
			}
			if _, err := Open(ctx, dsn); !errors.Is(err, errNewerFormat) {
				t.Fatalf("Open of a newer store: %v", err)
			}
			// Back at this format, the standby leads (its refusal kept no lock).
			if _, err := a.db.ExecContext(ctx, a.q(`UPDATE counters SET v = ? WHERE k = 'meta_format'`), metaFormat); err != nil {
				t.Fatal(err)
			}
			if ok, err := standby.Lead(ctx, "http://standby"); !ok || err != nil {
				t.Fatalf("standby: %v %v", ok, err)
			}
		})
	}
}
