"""The notification outbox beyond the database: the relay that delivers notifications
after their transition committed (:mod:`.relay`) and the channels a notification leaves by
(:mod:`.channels`). The rows and their transitions are the state store's
(:mod:`jobstate.stores.database.notification_outbox`).
"""
