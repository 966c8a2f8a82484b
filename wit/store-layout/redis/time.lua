-- The server's clock, the store's time authority (wit/clock.wit): TIME's
-- {seconds, microseconds}. Run as a script on one key (KEYS[1]: the prefix,
-- then byte 0x01, then "clock": no idem key has a control character), so
-- that on a Redis Cluster every host asks the node that holds that key's
-- slot, and all agree on one node's clock.
return redis.call('TIME')
