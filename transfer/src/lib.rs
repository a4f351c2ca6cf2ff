//! Transfer engine: registered memory and one-sided transports (filled by the transfer-engine work).
