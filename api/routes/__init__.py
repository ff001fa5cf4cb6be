"""The REST routes, one router per resource; each route is a thin call into api/ service modules."""
