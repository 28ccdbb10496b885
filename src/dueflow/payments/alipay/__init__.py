"""Alipay: RSA2 signing and verification of notifications, requests and responses."""
