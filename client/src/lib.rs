//! Yutu client library.
