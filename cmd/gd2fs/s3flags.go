package main

import (
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/spf13/pflag"
)

// s3Flags are the S3 options shared by the commands that reach the cold
// tier; unset ones come from the AWS environment variables.
type s3Flags struct {
	cfg cold.Config
}

func (s *s3Flags) add(f *pflag.FlagSet) {
	f.StringVar(&s.cfg.Endpoint, "s3-endpoint", "", "S3-compatible endpoint, e.g. http://127.0.0.1:9000 (env AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL)")
	f.StringVar(&s.cfg.Region, "s3-region", "", "region (env AWS_REGION / AWS_DEFAULT_REGION)")
	f.StringVar(&s.cfg.AccessKey, "s3-access-key", "", "access key (env AWS_ACCESS_KEY_ID)")
	f.StringVar(&s.cfg.SecretKey, "s3-secret-key", "", "secret key (env AWS_SECRET_ACCESS_KEY)")
	f.IntVar(&s.cfg.Retries, "s3-retries", 4, "retries per range GET, with backoff")
}

func (s *s3Flags) config() cold.Config { return s.cfg.FromEnv() }

func (s *s3Flags) source() (*cold.Source, error) { return cold.New(s.config()) }
