"""Money: metering of running work (rates, wallet and statements build on it)."""
