# An offline check of the templates (no provider, no AWS): renders each service's user data and
# TOML config the way the modules do, with sample values, for scripts/terraform-check.sh to
# parse (`bash -n`, a TOML parser) and compare with deploy/compose/config (provisioner.toml, which
# compose does not run yet, with the keys of kiln_cloud::PoolSpec), and the ARNs the
# provisioner's role may launch from (modules/provisioner-launch, statement LaunchFromThePools).
# Keep the arguments in step with modules/services/main.tf, modules/services/provisioner-iam.tf,
# modules/runner-pool/main.tf and the root's provisioner_pools and provisioner_launch.
terraform {
  required_version = ">= 1.6.0"
}

locals {
  templates = "${path.module}/../../templates"
  services  = "${path.module}/../../modules/services/config"
  pool      = "${path.module}/../../modules/runner-pool"

  sample = {
    instance                  = "kiln-api-0"
    private_ip                = "10.40.128.24"
    private_zone              = "kiln.internal"
    nats_urls                 = "nats://10.40.128.8:4222,nats://10.40.144.8:4222,nats://10.40.160.8:4222"
    nats_replicas             = 3
    objects_url               = "s3://kiln-bucket/kiln"
    region                    = "eu-west-1"
    batch_urls                = "http://10.40.128.48:7075,http://10.40.144.48:7075"
    scylla_nodes              = "\"10.40.128.16:9042\", \"10.40.144.16:9042\""
    scylla_keyspace           = "kiln"
    scylla_replication_factor = 3
    cluster                   = "kiln"
    # Both kinds of pool: by instance types (labels, negotiated prices) and by requirements;
    # the second with cluster_placement (its gangs' placement group), the first without.
    pools = [
      {
        name              = "cpu"
        region            = "eu-west-1"
        subnets           = ["subnet-0a", "subnet-0b"]
        instance_types    = ["m7i.2xlarge", "m6i.2xlarge"]
        requirements      = null
        capacity_types    = ["spot", "on-demand"]
        launch_template   = "kiln-runner-cpu"
        max_instances     = 20
        idle_timeout_secs = 300
        boot_timeout_secs = 600
        labels            = { team = "vision", "cost-centre" = "ml.42" }
        on_demand_prices  = { "m7i.2xlarge" = 0.35 }
        placement_group   = null
        disk              = { max_job_gib = 500, root_gib = 100, root_device = "/dev/xvda" }
      },
      {
        name           = "gpu"
        region         = "eu-west-1"
        subnets        = ["subnet-0a", "subnet-0b"]
        instance_types = []
        requirements = {
          vcpu       = [4, 16]
          memory_gib = [16, 64.5]
          gpus       = [1, 1]
          gpu_model  = ["A10G", "L4"]
          families   = []
        }
        capacity_types    = ["spot"]
        launch_template   = "kiln-runner-gpu"
        max_instances     = 8
        idle_timeout_secs = 600
        boot_timeout_secs = 900
        labels            = {}
        on_demand_prices  = {}
        placement_group   = "kiln-runner-gpu"
        disk              = { max_job_gib = 0, root_gib = 200, root_device = "/dev/xvda" }
      },
    ]
  }

  unit = {
    binaries             = ["kiln-api"]
    region               = "eu-west-1"
    bucket               = "kiln-bucket"
    release_prefix       = "releases/0.1.0"
    secret_arn           = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:rds!db-1"
    db_host              = "kiln.abc.eu-west-1.rds.amazonaws.com"
    db_port              = 5432
    db_name              = "kiln"
    setup                = ""
    after                = ""
    supplementary_groups = []
    ambient_capabilities = ""
    nats_seed_parameter  = "/kiln/nats/api"
  }

  configs = merge(
    { for s in ["api", "scheduler", "log-ingest", "item-batch", "advisor", "predictor", "provisioner"] : s => templatefile("${local.services}/${s}.toml.tftpl", local.sample) },
    {
      runner = templatefile("${local.pool}/runner.toml.tftpl", merge(local.sample, {
        pool           = "cpu"
        api_url        = "http://api.kiln.internal:7070"
        logs_url       = "http://log-ingest.kiln.internal:7071"
        job_endpoints  = ["item-batch.kiln.internal:7075", "advisor.kiln.internal:7076"]
        ecr_registries = ["123456789012.dkr.ecr.eu-west-1.amazonaws.com"]
      }))
    },
  )

  user_data = merge(
    { for s, c in local.configs : s => templatefile("${local.templates}/kiln-service.sh.tftpl", merge(local.unit, {
      service    = s
      unit       = "kiln-${s}"
      env_prefix = "KILN_${upper(replace(s, "-", "_"))}"
      config     = c
      setup = s != "log-ingest" ? "" : templatefile("${path.module}/../../modules/services/scylla-password.sh.tftpl", {
        region    = "eu-west-1"
        parameter = "/kiln/scylla/kiln"
      })
    })) if s != "runner" },
    { for gpu in [false, true] : (gpu ? "runner-gpu" : "runner") => templatefile("${local.templates}/kiln-service.sh.tftpl", merge(local.unit, {
      service              = "runner"
      unit                 = "kiln-runner"
      binaries             = ["kiln-runner", "kiln-agent"]
      env_prefix           = "KILN_RUNNER"
      config               = local.configs["runner"]
      after                = " docker.service kiln-imds-block.service"
      supplementary_groups = ["docker"]
      ambient_capabilities = "CAP_NET_ADMIN CAP_NET_RAW"
      setup                = templatefile("${local.pool}/setup.sh.tftpl", { gpu = gpu })
    })) },
    {
      scylla-roles = templatefile("${path.module}/../../modules/scylla/roles.sh.tftpl", {
        region    = "eu-west-1"
        parameter = "/kiln/scylla/kiln"
      })
    },
    {
      nats = templatefile("${path.module}/../../modules/nats/user-data.sh.tftpl", {
        server_name         = "kiln-nats-0"
        cluster_name        = "kiln-nats"
        routes              = "nats://10.40.128.8:6222,nats://10.40.144.8:6222"
        nats_server_version = "2.15.1"
        max_file_store_gb   = 90
        users_conf          = "authorization {\n  users = [\n    { nkey: \"UABC\", permissions: { publish: { allow: [\"$JS.API.INFO\"] } } }\n  ]\n}"
      })
    },
  )
}

# The resources of the provisioner's statement LaunchFromThePools, as the root gives them: a
# launch template and image per pool, and the placement group of each pool that has one.
module "provisioner_launch" {
  source     = "../../modules/provisioner-launch"
  partition  = "aws"
  region     = "eu-west-1"
  account_id = "123456789012"
  launch = {
    launch_template_arns  = [for p in local.sample.pools : "arn:aws:ec2:eu-west-1:123456789012:launch-template/lt-0${p.name}"]
    subnet_ids            = ["subnet-0a", "subnet-0b"]
    security_group_id     = "sg-0runner"
    image_ids             = ["ami-0cpu", "ami-0gpu"]
    placement_group_names = [for p in local.sample.pools : p.placement_group if p.placement_group != null]
  }
}

output "configs" {
  description = "Each service's rendered TOML config."
  value       = local.configs
}

output "user_data" {
  description = "Each kind of instance's rendered user data."
  value       = local.user_data
}

output "provisioner_launch" {
  description = "What the provisioner's role may launch runners from (statement LaunchFromThePools): ARNs."
  value       = module.provisioner_launch.resources
}
