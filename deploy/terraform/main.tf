# kiln on AWS: a VPC, the kiln key, the bucket, RDS Postgres, NATS and Scylla clusters, the kiln
# services (kiln-provisioner among them) and one launch template per runner pool, from which the
# provisioner launches the runners as jobs need them. See README.md.
provider "aws" {
  region = var.region

  default_tags {
    tags = {
      "kiln:deployment" = var.name
      "managed-by"      = "terraform"
    }
  }
}

data "aws_caller_identity" "current" {}

data "aws_ssm_parameter" "ami" {
  name = var.ami_ssm_parameter
}

data "aws_ssm_parameter" "gpu_ami" {
  count = anytrue([for p in var.pools : p.gpu && p.ami_id == null]) ? 1 : 0
  name  = var.gpu_ami_ssm_parameter
}

data "aws_ami" "scylla" {
  count       = var.scylla_ami_id == null ? 1 : 0
  owners      = ["797456418907"]
  most_recent = true

  filter {
    name   = "name"
    values = [var.scylla_ami_name]
  }

  filter {
    name   = "architecture"
    values = ["x86_64"]
  }
}

locals {
  azs            = length(var.availability_zones) > 0 ? var.availability_zones : [for z in ["a", "b", "c"] : "${var.region}${z}"]
  vpc_cidr       = var.vpc_cidr
  client_cidrs   = length(var.client_cidrs) > 0 ? var.client_cidrs : [var.vpc_cidr]
  metrics_cidrs  = length(var.metrics_cidrs) > 0 ? var.metrics_cidrs : [var.vpc_cidr]
  release_prefix = "releases/${var.kiln_version}"
  # The provisioner's cluster id: the kiln-cluster tag its IAM role is limited to.
  cluster = coalesce(var.cluster, var.name)
  service_instance_types = merge(
    { for s in ["api", "scheduler", "log-ingest", "item-batch", "advisor", "predictor", "provisioner"] : s => "m7i.large" },
    var.service_instance_types,
  )

  # Each service's NATS NKey seed, a SecureString put by put-nats-seeds.sh (never in the state).
  nats_seed_prefix     = "/${var.name}/nats"
  nats_seed_arn_prefix = "arn:aws:ssm:${var.region}:${data.aws_caller_identity.current.account_id}:parameter${local.nats_seed_prefix}"
  # The password of the Scylla role log-ingest logs in as (put-scylla-password.sh).
  scylla_password_parameter     = "/${var.name}/scylla/kiln"
  scylla_password_parameter_arn = "arn:aws:ssm:${var.region}:${data.aws_caller_identity.current.account_id}:parameter${local.scylla_password_parameter}"

  # The address plan: node i of a set is host (offset + i div AZs) of private subnet i mod AZs,
  # inside the first two /26s of each subnet, which are reserved for explicit addresses.
  plan = {
    # 8 hosts per set and subnet: enough for 9 replicas over 2 AZs. The first /26 ends with the
    # advisor (56 + 4); the predictor opens the second (64 to 127), the provisioner follows
    # (room for 6 more sets).
    nats        = { offset = 8, count = 3 }
    scylla      = { offset = 16, count = 3 }
    api         = { offset = 24, count = var.service_replicas }
    scheduler   = { offset = 32, count = var.service_replicas }
    log-ingest  = { offset = 40, count = var.service_replicas }
    item-batch  = { offset = 48, count = var.service_replicas }
    advisor     = { offset = 56, count = var.service_replicas }
    predictor   = { offset = 64, count = var.service_replicas }
    provisioner = { offset = 72, count = var.service_replicas }
  }
  ips = { for set, p in local.plan : set => [for i in range(p.count) :
    cidrhost(module.network.private_subnet_cidrs[i % length(local.azs)], p.offset + floor(i / length(local.azs)))
  ] }

  # Each runner pool's image and launch template name, known before the templates exist.
  pool_ami = { for pool, p in var.pools : pool => coalesce(p.ami_id,
  p.gpu ? one(data.aws_ssm_parameter.gpu_ami[*].insecure_value) : data.aws_ssm_parameter.ami.insecure_value) }
  launch_template_names = { for pool, p in var.pools : pool => "${var.name}-runner-${pool}" }

  # provisioner.toml's [[pools]] (docs/provisioner.md section 6); its template writes the keys as
  # kiln_cloud::PoolSpec reads them.
  provisioner_pools = [for pool, p in var.pools : {
    name              = pool
    region            = var.region
    subnets           = module.network.private_subnet_ids
    instance_types    = p.instance_types
    requirements      = p.requirements
    capacity_types    = p.capacity_types
    launch_template   = module.runner_pool[pool].launch_template_name
    max_instances     = p.max_instances
    idle_timeout_secs = p.idle_timeout_secs
    boot_timeout_secs = p.boot_timeout_secs
    labels            = p.labels
    on_demand_prices  = p.on_demand_prices
    # The pool's cluster placement group, for its gangs only; null without cluster_placement.
    placement_group = module.runner_pool[pool].placement_group_name
    # The launch template's root volume (volume_gb, /dev/xvda) grown for the jobs' --disk.
    disk = { max_job_gib = p.max_job_disk_gb, root_gib = p.volume_gb, root_device = "/dev/xvda" }
  }]

  database = {
    host       = module.postgres.address
    port       = module.postgres.port
    name       = module.postgres.database
    secret_arn = module.postgres.master_user_secret_arn
  }
}

module "kms" {
  source = "./modules/kms"
  name   = var.name
}

module "network" {
  source                  = "./modules/network"
  name                    = var.name
  cidr                    = local.vpc_cidr
  azs                     = local.azs
  single_nat_gateway      = var.single_nat_gateway
  kms_key_arn             = module.kms.arn
  flow_log_retention_days = var.flow_log_retention_days
}

module "security_groups" {
  source        = "./modules/security-groups"
  name          = var.name
  vpc_id        = module.network.vpc_id
  vpc_cidr      = local.vpc_cidr
  client_cidrs  = local.client_cidrs
  metrics_cidrs = local.metrics_cidrs
}

module "objects" {
  source                  = "./modules/objects"
  name                    = var.name
  kms_key_arn             = module.kms.arn
  noncurrent_version_days = var.noncurrent_version_days
}

# kiln HEADs this object at start to check the store answers; it exists so that a runner,
# which may not list the bucket outside outputs/, gets a 200 rather than a 403.
resource "aws_s3_object" "connect_probe" {
  bucket     = module.objects.bucket
  key        = "${var.objects_prefix}/kiln-connect-probe"
  content    = ""
  kms_key_id = module.kms.arn
}

module "postgres" {
  source                      = "./modules/postgres"
  name                        = var.name
  subnet_ids                  = module.network.private_subnet_ids
  security_group_id           = module.security_groups.ids["postgres"]
  kms_key_arn                 = module.kms.arn
  engine_version              = var.postgres.engine_version
  instance_class              = var.postgres.instance_class
  allocated_storage_gb        = var.postgres.allocated_storage_gb
  max_allocated_storage_gb    = var.postgres.max_allocated_storage_gb
  multi_az                    = var.postgres.multi_az
  backup_retention_days       = var.postgres.backup_retention_days
  iam_database_authentication = var.postgres.iam_database_authentication
  deletion_protection         = var.postgres.deletion_protection
}

module "nats" {
  source              = "./modules/nats"
  name                = var.name
  private_ips         = local.ips["nats"]
  subnet_ids          = module.network.private_subnet_ids
  ami_id              = data.aws_ssm_parameter.ami.insecure_value
  instance_type       = var.nats_instance_type
  security_group_id   = module.security_groups.ids["nats"]
  kms_key_arn         = module.kms.arn
  data_volume_gb      = var.nats_volume_gb
  nats_server_version = var.nats_server_version
  users_conf          = var.nats_users_conf
  depends_on          = [module.network]
}

module "scylla" {
  source                 = "./modules/scylla"
  name                   = var.name
  private_ips            = local.ips["scylla"]
  subnet_ids             = module.network.private_subnet_ids
  ami_id                 = var.scylla_ami_id != null ? var.scylla_ami_id : data.aws_ami.scylla[0].id
  instance_type          = var.scylla_instance_type
  security_group_id      = module.security_groups.ids["scylla"]
  kms_key_arn            = module.kms.arn
  region                 = var.region
  password_parameter     = local.scylla_password_parameter
  password_parameter_arn = local.scylla_password_parameter_arn
  depends_on             = [module.network]
}

module "services" {
  source = "./modules/services"
  name   = var.name
  region = var.region
  private_ips = {
    api         = local.ips["api"]
    scheduler   = local.ips["scheduler"]
    log-ingest  = local.ips["log-ingest"]
    item-batch  = local.ips["item-batch"]
    advisor     = local.ips["advisor"]
    predictor   = local.ips["predictor"]
    provisioner = local.ips["provisioner"]
  }
  private_zone                  = var.private_zone
  subnet_ids                    = module.network.private_subnet_ids
  instance_types                = local.service_instance_types
  ami_id                        = data.aws_ssm_parameter.ami.insecure_value
  security_group_ids            = module.security_groups.ids
  kms_key_arn                   = module.kms.arn
  bucket                        = module.objects.bucket
  bucket_arn                    = module.objects.arn
  objects_prefix                = var.objects_prefix
  release_prefix                = local.release_prefix
  nats_urls                     = module.nats.urls
  nats_replicas                 = 3
  nats_seed_prefix              = local.nats_seed_prefix
  nats_seed_arn_prefix          = local.nats_seed_arn_prefix
  database                      = local.database
  scylla_nodes                  = module.scylla.contact_points
  scylla_keyspace               = "kiln"
  scylla_replication_factor     = 3
  scylla_password_parameter     = local.scylla_password_parameter
  scylla_password_parameter_arn = local.scylla_password_parameter_arn
  # kiln-provisioner: its pools, and what its role may launch from and pass (and nothing else).
  cluster           = local.cluster
  provisioner_pools = local.provisioner_pools
  provisioner_launch = {
    launch_template_arns  = [for m in module.runner_pool : m.launch_template_arn]
    subnet_ids            = module.network.private_subnet_ids
    security_group_id     = module.security_groups.ids["runner"]
    image_ids             = distinct(values(local.pool_ami))
    runner_role_arns      = [for m in module.runner_pool : m.role_arn]
    placement_group_names = [for m in module.runner_pool : m.placement_group_name if m.placement_group_name != null]
  }
  depends_on = [module.network, aws_s3_object.connect_probe]
}

module "runner_pool" {
  source               = "./modules/runner-pool"
  for_each             = var.pools
  name                 = var.name
  pool                 = each.key
  cluster              = local.cluster
  launch_template_name = local.launch_template_names[each.key]
  region               = var.region
  gpu                  = each.value.gpu
  ami_id               = local.pool_ami[each.key]
  volume_gb            = each.value.volume_gb
  ecr_repositories     = each.value.ecr_repositories
  cluster_placement    = each.value.cluster_placement
  security_group_id    = module.security_groups.ids["runner"]
  kms_key_arn          = module.kms.arn
  bucket               = module.objects.bucket
  bucket_arn           = module.objects.arn
  objects_prefix       = var.objects_prefix
  release_prefix       = local.release_prefix
  nats_urls            = module.nats.urls
  nats_replicas        = 3
  nats_seed_prefix     = local.nats_seed_prefix
  nats_seed_arn_prefix = local.nats_seed_arn_prefix
  database             = local.database
  api_url              = "http://api.${var.private_zone}:7070"
  logs_url             = "http://log-ingest.${var.private_zone}:7071"
  # Besides the api and log-ingest: batch workers reach item-batch, sweep trials the advisor
  # (kiln.should_stop()), jobs the models served (the predictor's gRPC and HTTP).
  job_endpoints = [
    "item-batch.${var.private_zone}:7075",
    "advisor.${var.private_zone}:7076",
    "predictor.${var.private_zone}:7077",
    "predictor.${var.private_zone}:7078",
  ]
  depends_on = [aws_s3_object.connect_probe]
}
