"""The peers Evora is compared with, each driven through its own public API."""
