"""WeChat Pay v3: request signing, notification and response verification, resource encryption."""
