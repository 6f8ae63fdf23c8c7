"""Operating jobs on a cluster: Ray Jobs submission and KubeRay manifests (RayJob, RayCronJob)."""
