-- Run by the postgres image on its first start (an empty data volume), as the user of
-- POSTGRES_USER: the databases of the `ha-kafka` and `ha-mqtt` clusters
-- (docker/compose.yml). A store holds the resources of one middleware, so the RabbitMQ
-- `ha` cluster keeps `wsnmom`.
CREATE DATABASE wsnmom_kafka;
CREATE DATABASE wsnmom_mqtt;
