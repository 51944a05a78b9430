# The kiln services on fixed EC2 instances (not Auto Scaling groups): each replica has an
# address chosen in advance, because item-batch tells workers every replica's address
# (advertise-url), trials are given the address of the advisor replica that submitted them, and
# the scheduler, item-batch and advisor replicas hold leases under their own names. The
# predictor needs none of that (stateless replicas, its REST API advertised under its DNS name),
# but runs the same way, its replicas named together by predictor.ZONE. The provisioner's
# replicas hold its lease under their own names; only the leader calls EC2, with the one role
# that may launch and terminate runners (provisioner-iam.tf).
# A lost instance is recovered in place (auto recovery) and keeps its address.
locals {
  services = {
    api = {
      binary     = "kiln-api"
      env_prefix = "KILN_API"
    }
    scheduler = {
      binary     = "kiln-scheduler"
      env_prefix = "KILN_SCHEDULER"
    }
    log-ingest = {
      binary     = "kiln-log-ingest"
      env_prefix = "KILN_LOG_INGEST"
    }
    item-batch = {
      binary     = "kiln-item-batch"
      env_prefix = "KILN_ITEM_BATCH"
    }
    advisor = {
      binary     = "kiln-advisor"
      env_prefix = "KILN_ADVISOR"
    }
    predictor = {
      binary     = "kiln-predictor"
      env_prefix = "KILN_PREDICTOR"
    }
    provisioner = {
      binary     = "kiln-provisioner"
      env_prefix = "KILN_PROVISIONER"
    }
  }
  group = {
    api         = "api"
    scheduler   = "scheduler"
    log-ingest  = "log_ingest"
    item-batch  = "item_batch"
    advisor     = "advisor"
    predictor   = "predictor"
    provisioner = "provisioner"
  }

  objects_url = "s3://${var.bucket}/${var.objects_prefix}"
  # log-ingest's Scylla password, read at boot from SSM (put-scylla-password.sh).
  scylla_password_setup = templatefile("${path.module}/scylla-password.sh.tftpl", {
    region    = var.region
    parameter = var.scylla_password_parameter
  })
  batch_urls = join(",", [for ip in var.private_ips["item-batch"] : "http://${ip}:7075"])

  user_data = { for service, s in local.services : service => [
    for i, ip in var.private_ips[service] : templatefile("${path.module}/../../templates/kiln-service.sh.tftpl", {
      service              = service
      unit                 = s.binary
      binaries             = [s.binary]
      env_prefix           = s.env_prefix
      region               = var.region
      bucket               = var.bucket
      release_prefix       = var.release_prefix
      secret_arn           = var.database.secret_arn
      db_host              = var.database.host
      db_port              = var.database.port
      db_name              = var.database.name
      nats_seed_parameter  = "${var.nats_seed_prefix}/${service}"
      setup                = service == "log-ingest" ? local.scylla_password_setup : ""
      after                = ""
      supplementary_groups = []
      ambient_capabilities = ""
      config = templatefile("${path.module}/config/${service}.toml.tftpl", {
        instance                  = "${var.name}-${service}-${i}"
        private_ip                = ip
        private_zone              = var.private_zone
        nats_urls                 = var.nats_urls
        nats_replicas             = var.nats_replicas
        objects_url               = local.objects_url
        region                    = var.region
        batch_urls                = local.batch_urls
        scylla_nodes              = join(", ", [for node in var.scylla_nodes : "\"${node}\""])
        scylla_keyspace           = var.scylla_keyspace
        scylla_replication_factor = var.scylla_replication_factor
        cluster                   = var.cluster
        pools                     = var.provisioner_pools
      })
    })
  ] }
}

module "role" {
  source      = "../instance-role"
  for_each    = local.services
  name        = "${var.name}-${each.key}"
  policy_json = data.aws_iam_policy_document.service[each.key].json
}

module "nodes" {
  source             = "../node"
  for_each           = local.services
  name               = "${var.name}-${each.key}"
  private_ips        = var.private_ips[each.key]
  subnet_ids         = var.subnet_ids
  ami_id             = var.ami_id
  instance_type      = var.instance_types[each.key]
  security_group_ids = [var.security_group_ids[local.group[each.key]]]
  instance_profile   = module.role[each.key].profile_name
  kms_key_arn        = var.kms_key_arn
  root_volume_gb     = 30
  user_data          = local.user_data[each.key]
}
