"""The only code that talks to RabbitMQ: AMQP through aio-pika, the management HTTP API
through httpx, and the mapping of their errors onto rmqkit's exception tree."""
