"""Wire codec (msgpack + raw numpy, versioned, no pickle) and ZeroMQ endpoints."""
