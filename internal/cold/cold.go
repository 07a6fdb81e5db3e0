// Package cold is the cold tier: any S3-compatible object store, through
// minio-go. It reads byte ranges with retries and backoff, and lists model
// folders. Endpoint, region and credentials come from flags or from the usual
// AWS environment variables.
package cold

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Config reaches an S3-compatible endpoint.
type Config struct {
	Endpoint     string // host:port or URL; default s3.amazonaws.com
	Region       string
	AccessKey    string
	SecretKey    string
	SessionToken string
	Insecure     bool // plain HTTP (an http:// endpoint implies it)
	Retries      int  // attempts per range after the first (default 4)
}

// FromEnv fills the fields of c that are empty from AWS_ENDPOINT_URL_S3 /
// AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN.
func (c Config) FromEnv() Config {
	pick := func(cur string, keys ...string) string {
		if cur != "" {
			return cur
		}
		for _, k := range keys {
			if v := os.Getenv(k); v != "" {
				return v
			}
		}
		return ""
	}
	c.Endpoint = pick(c.Endpoint, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
	c.Region = pick(c.Region, "AWS_REGION", "AWS_DEFAULT_REGION")
	c.AccessKey = pick(c.AccessKey, "AWS_ACCESS_KEY_ID")
	c.SecretKey = pick(c.SecretKey, "AWS_SECRET_ACCESS_KEY")
	c.SessionToken = pick(c.SessionToken, "AWS_SESSION_TOKEN")
	return c
}

// Source reads objects from one endpoint.
type Source struct {
	mc  *minio.Client
	cfg Config
}

// Object is a listed or stat'ed object.
type Object struct {
	Key  string
	Size int64
	ETag string
}

// New connects (lazily: nothing is sent until the first call).
func New(cfg Config) (*Source, error) {
	ep := cfg.Endpoint
	secure := !cfg.Insecure
	if ep == "" {
		ep = "s3.amazonaws.com"
	}
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return nil, errs.New(errs.ErrBadRequest, "S3 endpoint %q: %w", ep, err)
		}
		secure = u.Scheme == "https"
		ep = u.Host
	}
	if cfg.Retries == 0 {
		cfg.Retries = 4
	}
	var cr *credentials.Credentials
	if cfg.AccessKey != "" {
		cr = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken)
	} else {
		cr = credentials.NewStatic("", "", "", credentials.SignatureAnonymous)
	}
	// MaxRetries 1 turns minio-go's own retries (10 by default) off: retry
	// is the one retry loop, so an S3 outage costs Retries+1 attempts per
	// call, not ten times as many.
	mc, err := minio.New(ep, &minio.Options{Creds: cr, Secure: secure, Region: cfg.Region, BucketLookup: minio.BucketLookupPath, MaxRetries: 1})
	if err != nil {
		return nil, errs.New(errs.ErrBadRequest, "S3 endpoint %q: %w", ep, err)
	}
	return &Source{mc: mc, cfg: cfg}, nil
}

// ParseURI splits s3://bucket/key.
func ParseURI(uri string) (bucket, key string, err error) {
	rest, ok := strings.CutPrefix(uri, "s3://")
	if !ok || rest == "" {
		return "", "", errs.New(errs.ErrBadRequest, "%q is not an s3://bucket/key URI", uri)
	}
	bucket, key, _ = strings.Cut(rest, "/")
	if bucket == "" {
		return "", "", errs.New(errs.ErrBadRequest, "%q has no bucket", uri)
	}
	return bucket, key, nil
}

// explain turns S3 errors into errs kinds with a hint; transient failures
// stay ErrUnavailable (retried), the rest are final.
func explain(err error, what string) error {
	if err == nil {
		return nil
	}
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "NoSuchBucket":
		return errs.New(errs.ErrNotFound, "%s: no such bucket (check the s3:// URI)", what)
	case "NoSuchKey", "NotFound":
		return errs.New(errs.ErrNotFound, "%s: no such object", what)
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken":
		return errs.New(errs.ErrUnauthorized, "%s: S3 refused the credentials (%s): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or --s3-access-key", what, resp.Code)
	case "PreconditionFailed":
		return errs.New(errs.ErrExists, "%s: the object changed since it was linked (ETag differs): link or pull it again", what)
	case "InvalidRange":
		return errs.New(errs.ErrOutOfRange, "%s: range outside the object", what)
	}
	return errs.New(errs.ErrUnavailable, "%s: %w", what, err)
}

func final(err error) bool {
	return errors.Is(err, errs.ErrNotFound) || errors.Is(err, errs.ErrUnauthorized) ||
		errors.Is(err, errs.ErrOutOfRange) || errors.Is(err, errs.ErrBadRequest) || errors.Is(err, context.Canceled)
}

// retry runs fn until it succeeds, fails finally, or runs out of attempts,
// backing off 100 ms, 200 ms, 400 ms, ...
func (s *Source) retry(ctx context.Context, fn func() error) error {
	var err error
	for attempt := 0; attempt <= s.cfg.Retries; attempt++ {
		if err = fn(); err == nil || final(err) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(100<<attempt) * time.Millisecond):
		}
	}
	return err
}

// Stat describes one object.
func (s *Source) Stat(ctx context.Context, bucket, key string) (Object, error) {
	var o Object
	err := s.retry(ctx, func() error {
		info, err := s.mc.StatObject(ctx, bucket, key, minio.StatObjectOptions{})
		if err != nil {
			return explain(err, "s3://"+bucket+"/"+key)
		}
		o = Object{Key: key, Size: info.Size, ETag: info.ETag}
		return nil
	})
	return o, err
}

// List returns every object under prefix (recursively), sorted by key.
func (s *Source) List(ctx context.Context, bucket, prefix string) ([]Object, error) {
	var out []Object
	err := s.retry(ctx, func() error {
		out = out[:0]
		if ok, err := s.mc.BucketExists(ctx, bucket); err != nil {
			return explain(err, "s3://"+bucket)
		} else if !ok {
			return errs.New(errs.ErrNotFound, "s3://%s: no such bucket (check the s3:// URI)", bucket)
		}
		for o := range s.mc.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
			if o.Err != nil {
				return explain(o.Err, "list s3://"+bucket+"/"+prefix)
			}
			out = append(out, Object{Key: o.Key, Size: o.Size, ETag: o.ETag})
		}
		return nil
	})
	return out, err
}

// ReadRange fills dst with bytes [off, off+len(dst)) of the object,
// retrying transient failures with backoff.
func (s *Source) ReadRange(ctx context.Context, bucket, key string, off int64, dst []byte) error {
	return s.ReadRangeETag(ctx, bucket, key, "", off, dst)
}

// ReadRangeETag is ReadRange that fails (errs.ErrExists: "changed") unless
// the object still has etag, so bytes of two versions never mix.
func (s *Source) ReadRangeETag(ctx context.Context, bucket, key, etag string, off int64, dst []byte) error {
	if len(dst) == 0 {
		return nil
	}
	what := fmt.Sprintf("s3://%s/%s [%d, %d)", bucket, key, off, off+int64(len(dst)))
	return s.retry(ctx, func() error {
		opts := minio.GetObjectOptions{}
		if err := opts.SetRange(off, off+int64(len(dst))-1); err != nil {
			return errs.New(errs.ErrBadRequest, "%s: %w", what, err)
		}
		if etag != "" {
			opts.SetMatchETag(etag)
		}
		obj, err := s.mc.GetObject(ctx, bucket, key, opts)
		if err != nil {
			return explain(err, what)
		}
		defer obj.Close()
		n, err := io.ReadFull(obj, dst)
		if err != nil {
			if e := explain(err, what); !errors.Is(e, errs.ErrUnavailable) {
				return e
			}
			return errs.New(errs.ErrUnavailable, "%s: read %d of %d bytes: %w", what, n, len(dst), err)
		}
		return nil
	})
}
